"""Rules that keep one key (or one owner) from growing its own powers, and usage plausible.

- Owner names: stripped, 1..200 printable characters; "admin" (any case) is reserved for
  admin keys, so no ordinary key can ever share an owner with the admin key (an owner's keys
  may revoke each other).
- A non-admin key creating a key: the new key's limits are at most the creator's own (an
  unset limit inherits the creator's; asking for more is refused), and the owner's aggregate
  limit is pinned to the creator's limits if it had none, so minting many keys does not
  multiply the allowance.
- Its expiry is no later than the creator's own (an unset expiry inherits the creator's),
  and its model allowlist is a subset of the creator's (an unset one inherits it): a key
  cannot outlive, nor reach models beyond, the key that made it.
- Keys per owner are capped (`MAX_KEYS_PER_OWNER` active keys).
- Usage is a claim by the provider: token counts are clamped to [0, MAX_TOKENS_PER_REQUEST]
  before they reach a bucket or the ledger.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable

from llmfabric.accounts.errors import InvalidRequest, PermissionDenied
from llmfabric.accounts.models import ApiKey

RESERVED_OWNER = "admin"
MAX_OWNER_LEN = 200
MAX_KEYS_PER_OWNER = 100
# No single request plausibly uses more (context windows are ~1e6 tokens): a provider that
# claims more is clamped, so a ledger row (BIGINT) cannot overflow in 2**63 / 1e8 requests.
MAX_TOKENS_PER_REQUEST = 100_000_000
# Largest requests/tokens per minute a key or owner may be given over HTTP: far past any real
# limit, and it fits the limit columns (INTEGER: 32 bits on Postgres); larger values raised in
# the database driver, a 500 the API fuzz test found.
MAX_RATE_LIMIT = 2**31 - 1
# A key's model allowlist: at most this many ids, each at most MAX_MODEL_ID_CHARS printable
# characters (as ingress.request_body.MAX_MODEL_CHARS: no longer name is ever served).
MAX_KEY_MODELS = 256
MAX_MODEL_ID_CHARS = 512
# The latest expiry a key may be given (year 9999: past it, dates cannot be shown).
MAX_EXPIRES_AT = dt.datetime(9999, 12, 31, tzinfo=dt.UTC).timestamp()


def clamp_tokens(n: object) -> int:
    """A provider-reported token count as a plausible non-negative int (0 if not a number)."""
    if type(n) is int and 0 <= n <= MAX_TOKENS_PER_REQUEST:
        return n  # the common case, once per count on every request (bool is not int here)
    if isinstance(n, bool) or not isinstance(n, int | float) or n != n:
        return 0
    return int(min(max(n, 0), MAX_TOKENS_PER_REQUEST))


def normalize_owner(owner: str, *, admin: bool) -> str:
    """The stored form of an owner name; raise InvalidRequest/PermissionDenied if refused."""
    name = owner.strip()
    if not name or len(name) > MAX_OWNER_LEN or not name.isprintable():
        raise InvalidRequest(
            f"owner must be 1..{MAX_OWNER_LEN} printable characters, got {owner!r}")
    if name.casefold() == RESERVED_OWNER and not admin:
        raise PermissionDenied(
            f"owner {RESERVED_OWNER!r} is reserved for admin keys; choose another owner name")
    return name


def inherited_limit(name: str, asked: int | None, creator: int | None) -> int | None:
    """The limit a key created by a key with limit `creator` gets when it asks for `asked`."""
    if creator is None:
        return asked
    if asked is None:
        return creator
    if asked > creator:
        raise PermissionDenied(
            f"{name}={asked} is higher than the creating key's own ({creator}); "
            "ask an admin for a key with higher limits")
    return asked


def limits_for_new_key(
    by: ApiKey | None, requests_per_min: int | None, tokens_per_min: int | None
) -> tuple[int | None, int | None]:
    """(requests_per_min, tokens_per_min) of a key created by `by` (None: the operator)."""
    if by is None or by.admin:
        return requests_per_min, tokens_per_min
    return (inherited_limit("requests_per_min", requests_per_min, by.requests_per_min),
            inherited_limit("tokens_per_min", tokens_per_min, by.tokens_per_min))


def check_expiry(expires_at: float, now: float) -> None:
    """Refuse (InvalidRequest) an expiry that is not a time after `now` (Unix seconds)."""
    if not math.isfinite(expires_at) or expires_at > MAX_EXPIRES_AT:
        raise InvalidRequest("expires_at must be a time before the year 10000 (Unix seconds)")
    if expires_at <= now:
        raise InvalidRequest("expires_at is in the past: a key must expire in the future")


def check_models(models: Iterable[str]) -> frozenset[str]:
    """A model allowlist as stored: 1..MAX_KEY_MODELS stripped, printable model ids."""
    if isinstance(models, str):
        raise InvalidRequest("models must be a list of model ids")
    out = set()
    for m in models:
        name = m.strip() if isinstance(m, str) else ""
        if not name or len(name) > MAX_MODEL_ID_CHARS or not name.isprintable():
            raise InvalidRequest(f"each model id must be 1..{MAX_MODEL_ID_CHARS} printable "
                                 f"characters, got {m!r}")
        out.add(name)
    if not out:
        raise InvalidRequest("models must name at least one model id (leave it unset for all "
                             "models)")
    if len(out) > MAX_KEY_MODELS:
        raise InvalidRequest(f"a key may list at most {MAX_KEY_MODELS} models")
    return frozenset(out)


def expiry_for_new_key(by: ApiKey | None, asked: float | None) -> float | None:
    """The expiry of a key created by `by` (None: the operator) that asks for `asked`."""
    if by is None or by.admin or by.expires_at is None:
        return asked
    if asked is None:
        return by.expires_at
    if asked > by.expires_at:
        raise PermissionDenied(
            f"expires_at={asked:.0f} is later than the creating key's own expiry "
            f"({by.expires_at:.0f}); a key cannot outlive the key that creates it")
    return asked


def models_for_new_key(by: ApiKey | None, asked: frozenset[str] | None
                       ) -> frozenset[str] | None:
    """The model allowlist of a key created by `by` (None: the operator) that asks for
    `asked` (None: all models)."""
    if by is None or by.admin or by.models is None:
        return asked
    if asked is None:
        return by.models
    beyond = asked - by.models
    if beyond:
        raise PermissionDenied(
            f"models {', '.join(sorted(beyond))} are not among the creating key's own; a "
            "key may only narrow the models of the key that creates it")
    return asked
