"""API keys, usage ledger and rate limits (SQLite in WAL mode by default, Postgres by URL).

Files:
  models.py     ApiKey, UsageRow (frozen value types; never the secret)
  keyfmt.py     key plaintext format `lf-<id>-<secret>`, SHA-256 hashing, constant-time match
  db.py         Backend interface; SQLite (worker thread) and Postgres (psycopg 3: one shared
                connection behind a lock, reconnects when dropped) backends
  store.py      AccountStore: create/authenticate (cached)/list/get/revoke keys, usage API
  ledger.py     UsageLedger: in-memory aggregation per key/model/day, batched additive upserts
                (numbered batches: which usage is in the database yet)
  ratelimit.py  RateLimiter: requests/min and tokens/min token buckets (per key and per owner)
  grants.py     key grants (hashes) an ingress publishes in its record; RemoteGrants for the
                ingresses that trust it as a key issuer
  policy.py     what keys may do to grow their powers (limit, expiry and model allowlist
                inheritance, keys per owner, reserved owner "admin") and usage clamping
                (clamp_tokens)
  expiry.py     key expiry as written (30d, 12h, 2027-01-31[T..Z]) -> Unix seconds, and the
                message an expired key's holder gets
  bootstrap.py  ensure_admin_key (the admin key file an ingress or demo starts with),
                default paths ($LLMFABRIC_DB, $LLMFABRIC_HOME, ~/.llmfabric)
  http.py       add_account_routes: /v1/fabric/keys and /v1/fabric/usage for the ingress
  budgets.py    BudgetBook: token or spend (USD) budgets per key/owner/team per UTC
                day/month, enforced with reservations (no overspend by concurrent
                requests); BudgetStore (tables budgets, owner_teams, model_prices; sync():
                in step with other processes on the same database every 2 s)
  spend_share.py budgets across ingresses: the bounded spend item (hashed budget names,
                period-scoped totals) an ingress publishes in its record, RemoteSpend (the
                trusted ingresses' newest items, summed, kept after they leave),
                SpendPublisher, share_spend (not on a shared ledger) and its gauges
  prices.py     Price: USD per million prompt/completion tokens per model (spend budgets)
  fairqueue.py  FairQueue: per-owner fair queueing (virtual token counters) past a capacity
  export.py     usage export (ExportFilter, CSV/JSON rendering)
  tenancy_http.py add_tenancy_routes: /v1/fabric/budgets, /v1/fabric/teams, /v1/fabric/prices and
                /v1/fabric/usage/export
  errors.py     AccountsError hierarchy (RateLimited carries retry_after_s)
"""

from llmfabric.accounts.bootstrap import (
    default_admin_key_file,
    default_db_url,
    ensure_admin_key,
    fabric_home,
)
from llmfabric.accounts.errors import (
    AccountsError,
    BackendUnavailable,
    InvalidRequest,
    KeyNotFound,
    PermissionDenied,
    RateLimited,
)
from llmfabric.accounts.models import ApiKey, UsageRow
from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.store import AccountStore

__all__ = [
    "AccountStore",
    "AccountsError",
    "ApiKey",
    "BackendUnavailable",
    "InvalidRequest",
    "KeyNotFound",
    "PermissionDenied",
    "RateLimited",
    "RateLimiter",
    "UsageRow",
    "default_admin_key_file",
    "default_db_url",
    "ensure_admin_key",
    "fabric_home",
]
