"""AccountStore: API keys (hashed, shown once), an auth cache, and the usage ledger.

Hot path: `authenticate()` answers from an in-memory cache of every key (loaded at open,
refreshed every `refresh_interval_s` so keys created or revoked by another process, such as
the `llmfabric keys` CLI, are seen); only a key id never seen before costs one indexed query,
and unknown ids are negatively cached. `record_usage()` never does I/O; a background task
flushes the ledger every `flush_interval_s` and `aclose()` flushes what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from llmfabric.accounts import keyfmt
from llmfabric.accounts.db import Backend, open_backend
from llmfabric.accounts.errors import InvalidRequest, KeyNotFound, PermissionDenied
from llmfabric.accounts.export import ExportFilter
from llmfabric.accounts.ledger import UsageLedger
from llmfabric.accounts.models import ApiKey, UsageRow
from llmfabric.accounts.policy import (
    MAX_KEYS_PER_OWNER,
    check_expiry,
    check_models,
    expiry_for_new_key,
    limits_for_new_key,
    models_for_new_key,
    normalize_owner,
)
from llmfabric.clock import Clock, SystemClock
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

_COLS = (
    "id, key_hash, name, owner, admin, created_at, revoked_at, requests_per_min, "
    "tokens_per_min, record_trace, expires_at, models"
)
_NEGATIVE_TTL_S = 5.0
# Database lookups of key ids the cache does not hold, per second (and burst): a key made
# by another process since the last refresh is rare, while anybody can send well-formed
# keys with made-up ids, each one a query on the store's single connection. Past the rate
# such an id is refused until the next refresh (at most `refresh_interval_s`) loads it.
_MISS_LOOKUPS_PER_S = 20.0


def _row_to_key(row: tuple[Any, ...]) -> tuple[str, ApiKey]:
    return str(row[1]), ApiKey(
        id=str(row[0]),
        name=str(row[2]),
        owner=str(row[3]),
        admin=bool(row[4]),
        created_at=float(row[5]),
        revoked_at=None if row[6] is None else float(row[6]),
        requests_per_min=None if row[7] is None else int(row[7]),
        tokens_per_min=None if row[8] is None else int(row[8]),
        record_trace=bool(row[9]),
        hash=str(row[1]),
        expires_at=None if row[10] is None else float(row[10]),
        models=None if row[11] is None else decode_models(str(row[11])),
    )


def decode_models(text: str) -> frozenset[str] | None:
    """A stored allowlist (a JSON list of model ids); one that does not read as such allows
    no model (fail closed: a damaged row must not open every model)."""
    try:
        got = json.loads(text)
    except ValueError:
        return frozenset()
    if not isinstance(got, list):
        return frozenset()
    return frozenset(m for m in got if isinstance(m, str))


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise InvalidRequest(f"{name} must be a positive integer or unset (unlimited)")


class AccountStore:
    def __init__(
        self,
        backend: Backend,
        *,
        clock: Clock | None = None,
        flush_interval_s: float = 1.0,
        refresh_interval_s: float = 5.0,
        max_keys_per_owner: int = MAX_KEYS_PER_OWNER,
    ) -> None:
        self._db = backend
        self.max_keys_per_owner = max_keys_per_owner
        # owner -> (requests_per_min, tokens_per_min), each None for unlimited
        self._owner_limits: dict[str, tuple[int | None, int | None]] = {}
        self._clock: Clock = clock or SystemClock()
        self._flush_interval = flush_interval_s
        self._refresh_interval = refresh_interval_s
        self._keys: dict[str, tuple[str, ApiKey]] = {}  # id -> (hash, key)
        # Keys verified against their hash, by plaintext -> (id, the `_keys` entry then): a
        # repeat skips the parse and the hash while that entry is still the one in `_keys`
        # (a revocation or refresh replaces it).
        self._verified: dict[str, tuple[str, tuple[str, ApiKey]]] = {}
        self._unknown: dict[str, float] = {}  # id -> clock.now() until which it stays unknown
        self._miss_budget = (_MISS_LOOKUPS_PER_S, 0.0)  # (lookups left, at clock.now())
        # Keys other ingresses vouch for (accounts.grants.RemoteGrants.lookup), or None.
        self.remote: Callable[[str], ApiKey | None] | None = None
        self._ledger = UsageLedger(backend, self._clock.wall)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Key creation, from the cap check to the cache update: concurrent creations (one
        # POST each) all passed the cap check before any insert was done.
        self._create_lock = asyncio.Lock()
        # Background failures by kind (usage_flush, key_refresh), each logged with its
        # traceback; a node exports them (llmfabric_node_task_failures_total).
        self.failures: Counter[str] = Counter()

    @property
    def backend(self) -> Backend:
        """The database (for tables kept beside the keys: accounts.budgets)."""
        return self._db

    @property
    def ledger(self) -> UsageLedger:
        """The usage ledger (accounts.budgets follows which of its batches are written)."""
        return self._ledger

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        flush_interval_s: float = 1.0,
        refresh_interval_s: float = 5.0,
        background: bool = True,
    ) -> AccountStore:
        """Open (creating if needed) the store at `url`: "sqlite:///path", a plain path, or
        "postgresql://...". `background=False` skips the flush task (CLI use)."""
        store = cls(
            await open_backend(url),
            clock=clock,
            flush_interval_s=flush_interval_s,
            refresh_interval_s=refresh_interval_s,
        )
        await store.refresh()
        if background:
            store._task = asyncio.create_task(store._run(), name="accounts-flush")
        return store

    async def aclose(self) -> None:
        """Stop the flush task, write every pending usage row, close the database."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._ledger.flush()
        finally:
            await self._db.aclose()

    async def __aenter__(self) -> AccountStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> None:
        since_refresh = 0.0
        while True:
            await self._clock.sleep(self._flush_interval)
            since_refresh += self._flush_interval
            # Separately: a flush that keeps failing (database down) must not stop key
            # refresh, or revocations made elsewhere would never be seen here.
            try:
                await self._ledger.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures["usage_flush"] += 1
                log.exception("accounts: usage flush failed; rows kept, will retry")
            if since_refresh >= self._refresh_interval:
                since_refresh = 0.0
                try:
                    await self.refresh()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self.failures["key_refresh"] += 1
                    log.exception("accounts: key refresh failed; will retry")

    # -- keys ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Reload the key cache from the database (picks up other processes' changes)."""
        rows = await self._db.fetchall(f"SELECT {_COLS} FROM api_keys")
        limits = await self._db.fetchall(
            "SELECT owner, requests_per_min, tokens_per_min FROM owner_limits")
        self._owner_limits = {
            str(o): (None if r is None else int(r), None if t is None else int(t))
            for o, r, t in limits}
        self._keys = {key.id: (h, self._with_owner_limits(key))
                      for h, key in map(_row_to_key, rows)}
        self._unknown.clear()

    def _with_owner_limits(self, key: ApiKey) -> ApiKey:
        rpm, tpm = self._owner_limits.get(key.owner, (None, None))
        if (rpm, tpm) == (key.owner_requests_per_min, key.owner_tokens_per_min):
            return key
        return dataclasses.replace(key, owner_requests_per_min=rpm, owner_tokens_per_min=tpm)

    async def set_owner_limits(
        self, owner: str, requests_per_min: int | None, tokens_per_min: int | None
    ) -> None:
        """Limit all of `owner`'s keys together (None: unlimited); takes effect at once here,
        at the next refresh in other processes."""
        _check_limit("requests_per_min", requests_per_min)
        _check_limit("tokens_per_min", tokens_per_min)
        await self._db.execute(
            "INSERT INTO owner_limits (owner, requests_per_min, tokens_per_min) VALUES (?, ?, ?)"
            " ON CONFLICT (owner) DO UPDATE SET requests_per_min = excluded.requests_per_min,"
            " tokens_per_min = excluded.tokens_per_min",
            (owner, requests_per_min, tokens_per_min))
        self._owner_limits[owner] = (requests_per_min, tokens_per_min)
        self._keys = {i: (h, self._with_owner_limits(k)) for i, (h, k) in self._keys.items()}

    def now(self) -> float:
        """Wall-clock Unix seconds by the store's clock (what expiries are compared with)."""
        return self._clock.wall()

    def cached_keys(self) -> list[ApiKey]:
        """Every key in the cache (what this ingress may publish as grants)."""
        return [k for _, k in self._keys.values()]

    def owner_limits(self, owner: str) -> tuple[int | None, int | None]:
        return self._owner_limits.get(owner, (None, None))

    async def create_key(
        self,
        name: str,
        owner: str,
        *,
        admin: bool = False,
        requests_per_min: int | None = None,
        tokens_per_min: int | None = None,
        record_trace: bool = True,
        expires_at: float | None = None,
        models: Iterable[str] | None = None,
        by: ApiKey | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns its record and the plaintext, which is never shown again.

        `expires_at`: Unix seconds after which it is refused (None: never); `models`: the
        model ids it may use (None: all). `by` is the creating key (None: the local
        operator). A non-admin creator cannot give the new key higher limits, a later expiry
        or more models than its own (accounts.policy); the owner's active keys are capped
        at `max_keys_per_owner`; owner "admin" is reserved for admin keys."""
        if not name.strip() or not owner.strip():
            raise InvalidRequest("a key needs a non-empty name and owner")
        owner = normalize_owner(owner, admin=admin)
        _check_limit("requests_per_min", requests_per_min)
        _check_limit("tokens_per_min", tokens_per_min)
        now = self._clock.wall()
        if expires_at is not None:
            check_expiry(expires_at, now)
        allowed = None if models is None else check_models(models)
        requests_per_min, tokens_per_min = limits_for_new_key(by, requests_per_min,
                                                              tokens_per_min)
        expires_at = expiry_for_new_key(by, expires_at)
        allowed = models_for_new_key(by, allowed)
        async with self._create_lock:
            active = sum(1 for _, k in self._keys.values()
                         if k.owner == owner and k.active and not k.expired(now))
            if active >= self.max_keys_per_owner:
                raise PermissionDenied(
                    f"owner {owner!r} already has {active} active keys (the cap is "
                    f"{self.max_keys_per_owner}); revoke unused keys first")
            if by is not None and not by.admin:
                # More keys must not mean more allowance: the owner as a whole keeps the
                # creator's limits, on each dimension the owner has no limit of its own (an
                # admin limiting only requests must not free the creator's tokens).
                rpm, tpm = self._owner_limits.get(owner, (None, None))
                pinned = (by.requests_per_min if rpm is None else rpm,
                          by.tokens_per_min if tpm is None else tpm)
                if pinned != (rpm, tpm):
                    await self.set_owner_limits(owner, *pinned)
            key_id, plaintext = keyfmt.new_key()
            digest = keyfmt.hash_key(plaintext)
            key = ApiKey(
                id=key_id,
                name=name.strip(),
                owner=owner.strip(),
                admin=admin,
                created_at=self._clock.wall(),
                requests_per_min=requests_per_min,
                tokens_per_min=tokens_per_min,
                record_trace=record_trace,
                hash=digest,
                expires_at=expires_at,
                models=allowed,
            )
            await self._db.execute(
                f"INSERT INTO api_keys ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key.id, digest, key.name, key.owner, int(admin), key.created_at, None,
                 requests_per_min, tokens_per_min, int(record_trace), expires_at,
                 None if allowed is None else json.dumps(sorted(allowed))),
            )
            key = self._with_owner_limits(key)
            self._keys[key.id] = (digest, key)
        return key, plaintext

    def authenticate_cached(self, plaintext: str) -> ApiKey | None:
        """`authenticate`'s answer for a key verified before and unchanged since, if it is
        active, without a coroutine (the ingress asks this first, per request); None: ask
        `authenticate`."""
        seen = self._verified.get(plaintext)
        if seen is not None and self._keys.get(seen[0]) is seen[1]:
            key = seen[1][1]
            # (a key without expiry: one None check; with one, a clock read and a compare)
            if key.revoked_at is None and (key.expires_at is None
                                           or key.expires_at > self._clock.wall()):
                return key
        return None

    def expired_at(self, plaintext: str) -> float | None:
        """When the key `plaintext` expired, if `authenticate` refused it for that alone (a
        real, unrevoked key of ours past its expiry): what the refusal tells its holder.
        None otherwise (no lookup: only a key `authenticate` verified is known here)."""
        seen = self._verified.get(plaintext)
        if seen is None or self._keys.get(seen[0]) is not seen[1]:
            return None
        key = seen[1][1]
        if key.revoked_at is None and key.expired(self._clock.wall()):
            return key.expires_at
        return None

    async def authenticate(self, plaintext: str) -> ApiKey | None:
        """The active, unexpired key whose plaintext this is, else None (`expired_at` tells
        an expired key apart). Cached: no I/O for known keys."""
        if (known := self.authenticate_cached(plaintext)) is not None:
            return known
        if self.expired_at(plaintext) is not None:
            return None  # (verified before: no second hash)
        key_id = keyfmt.parse_key_id(plaintext)
        if key_id is None:
            return None
        entry = self._keys.get(key_id)
        if entry is None and self.remote is not None:
            granted = self.remote(key_id)  # not cached: a revocation elsewhere is instant
            if granted is not None:
                ok = keyfmt.matches(plaintext, granted.hash)
                return self._with_owner_limits(granted) if ok else None
        if entry is None:
            now = self._clock.now()
            if self._unknown.get(key_id, -1.0) > now or not self._take_miss_lookup(now):
                return None
            rows = await self._db.fetchall(f"SELECT {_COLS} FROM api_keys WHERE id = ?", (key_id,))
            if not rows:
                if len(self._unknown) > 10_000:
                    self._unknown.clear()
                self._unknown[key_id] = now + _NEGATIVE_TTL_S
                return None
            h, found = _row_to_key(rows[0])
            entry = (h, self._with_owner_limits(found))
            self._keys[key_id] = entry
        digest, key = entry
        if not keyfmt.matches(plaintext, digest) or not key.active:
            return None
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[plaintext] = (key_id, entry)  # (expired too: for `expired_at`)
        return None if key.expired(self._clock.wall()) else key

    def _take_miss_lookup(self, now: float) -> bool:
        """One database lookup of an uncached key id, if the rate allows (a token bucket)."""
        left, at = self._miss_budget
        left = min(_MISS_LOOKUPS_PER_S, left + max(0.0, now - at) * _MISS_LOOKUPS_PER_S)
        if left < 1.0:
            self._miss_budget = (left, now)
            return False
        self._miss_budget = (left - 1.0, now)
        return True

    async def active_key(self, key_id: str) -> ApiKey | None:
        """The key with this id if it still exists, is not revoked and has not expired,
        with its owner's limits (None otherwise): who a stored job (a batch) runs as,
        re-checked before each of its requests without the plaintext. From the cache (a
        revocation here is seen at once, one elsewhere at the next refresh), else the
        database."""
        entry = self._keys.get(key_id)
        if entry is None and self.remote is not None:
            granted = self.remote(key_id)  # (a key another ingress vouches for)
            if granted is not None:
                return self._with_owner_limits(granted) if granted.active else None
        if entry is None:
            rows = await self._db.fetchall(f"SELECT {_COLS} FROM api_keys WHERE id = ?",
                                           (key_id,))
            if not rows:
                return None
            digest, found = _row_to_key(rows[0])
            entry = self._keys[key_id] = (digest, self._with_owner_limits(found))
        key = entry[1]
        return key if key.active and not key.expired(self._clock.wall()) else None

    async def get(self, key_id: str) -> ApiKey:
        rows = await self._db.fetchall(f"SELECT {_COLS} FROM api_keys WHERE id = ?", (key_id,))
        if not rows:
            raise KeyNotFound(
                f"no API key with id {key_id!r}; list keys with `llmfabric keys list`"
            )
        return _row_to_key(rows[0])[1]

    async def list_keys(self, owner: str | None = None) -> list[ApiKey]:
        if owner is None:
            rows = await self._db.fetchall(f"SELECT {_COLS} FROM api_keys ORDER BY created_at, id")
        else:
            rows = await self._db.fetchall(
                f"SELECT {_COLS} FROM api_keys WHERE owner = ? ORDER BY created_at, id", (owner,)
            )
        return [_row_to_key(r)[1] for r in rows]

    async def revoke(self, key_id: str, *, by: ApiKey | None) -> ApiKey:
        """Revoke a key. `by` is the acting key (its own owner's keys, or any if admin);
        None means the local operator (direct database access, e.g. the CLI)."""
        key = await self.get(key_id)
        if by is not None and not by.admin and by.owner != key.owner:
            raise PermissionDenied(
                f"key {by.id} (owner {by.owner!r}) may not revoke a key of owner {key.owner!r}; "
                "ask an admin"
            )
        if key.revoked_at is not None:
            return key
        when = self._clock.wall()
        await self._db.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (when, key_id),
        )
        revoked = self._with_owner_limits(await self.get(key_id))
        entry = self._keys.get(key_id)
        self._keys[key_id] = (entry[0] if entry else "", revoked)
        return revoked

    # -- usage --------------------------------------------------------------------------

    def record_usage(
        self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
        estimated: bool = False,
    ) -> None:
        """Count one request's tokens (`estimated`: the ingress counted them). Never blocks:
        written by the next periodic flush."""
        self._ledger.record(key_id, model, prompt_tokens, completion_tokens, estimated)

    @property
    def usage_recorder(self) -> Callable[[str, str, int, int, bool], None]:
        """`record_usage` without the extra call (the ledger's own method), for per-request
        callers that bind it once."""
        return self._ledger.record

    async def flush(self) -> int:
        """Write pending usage now; returns the number of rows written."""
        return await self._ledger.flush()

    async def usage(
        self, key_id: str | None = None, owner: str | None = None, since_day: str | None = None,
        until_day: str | None = None, model: str | None = None,
    ) -> list[UsageRow]:
        """Usage rows (pending ones flushed first), filtered by key, owner, model and UTC
        days (first and last, inclusive)."""
        await self._ledger.flush()
        return await self._ledger.query(key_id=key_id, owner=owner, since_day=since_day,
                                        until_day=until_day, model=model)

    async def usage_pages(self, flt: ExportFilter, batch: int | None = None
                          ) -> AsyncIterator[list[UsageRow]]:
        """The rows `usage` returns for `flt`, `batch` (default: ledger.EXPORT_BATCH) at a
        time (pending ones flushed first; accounts.ledger `pages`: memory stays at about one
        batch)."""
        await self._ledger.flush()
        async for rows in self._ledger.pages(flt.key_id, flt.owner, flt.since, flt.until,
                                             flt.model, batch):
            yield rows

    async def usage_totals(self, flt: ExportFilter) -> tuple[int, int, int]:
        """(requests, prompt tokens, completion tokens) over the rows of `flt` (pending ones
        flushed first)."""
        await self._ledger.flush()
        return await self._ledger.totals(flt.key_id, flt.owner, flt.since, flt.until,
                                         flt.model)
