"""Accounts under abuse: a provider claiming absurd usage, a key trying to grow its own
powers, an owner trying to pass for the admin (on both backends: `accounts_db`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llmfabric.accounts import AccountStore, PermissionDenied
from llmfabric.accounts.errors import RateLimited
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.ingress.usage import StreamUsageScanner, usage_from_body
from llmfabric.tenancy.accounts_auth import AccountsAuth
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.hostile


@pytest.fixture
async def store(accounts_db: str) -> AsyncIterator[AccountStore]:
    s = await AccountStore.open(accounts_db, clock=FakeClock(), background=False)
    yield s
    await s.aclose()


def test_absurd_usage_claims_are_clamped_where_they_are_read() -> None:
    body = b'{"usage": {"prompt_tokens": 18446744073709551615, "completion_tokens": -7}}'
    assert usage_from_body(body) == (MAX_TOKENS_PER_REQUEST, 0)
    scan = StreamUsageScanner(strip_usage_chunk=False)
    scan.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 1e300, '
              b'"completion_tokens": 99999999999999999999999}}\n\n')
    assert scan.usage is None  # a float prompt count is not a usage report
    scan.feed(b'data: {"choices": [], "usage": {"prompt_tokens": 18446744073709551615, '
              b'"completion_tokens": -1}}\n\n')
    after: object = scan.usage  # (mypy narrowed scan.usage to None above)
    assert after == (MAX_TOKENS_PER_REQUEST, 0)
    assert usage_from_body(b'{"usage": {"prompt_tokens": true}}') is None


async def test_a_provider_claiming_2_64_tokens_breaks_neither_flush_nor_refresh(
    store: AccountStore,
) -> None:
    key, plain = await store.create_key("app", "alice")
    auth = AccountsAuth(store, RateLimiter(FakeClock()))
    for _ in range(3):
        auth.record(key.id, "m", 2**64 - 1, 2**64 - 1)  # what a hostile provider reports
    auth.record(key.id, "m", 10, 5)
    store.record_usage(key.id, "raw", 2**64 - 1, -1)  # even unclamped callers
    assert await store.flush() == 2
    rows = {r.model: r for r in await store.usage(key_id=key.id)}
    assert rows["m"].prompt_tokens == 3 * MAX_TOKENS_PER_REQUEST + 10
    assert rows["raw"].completion_tokens == 0 and rows["raw"].requests == 1
    # the ledger keeps flushing and revocations made elsewhere are still seen
    store.record_usage(key.id, "m", 1, 1)
    assert await store.flush() == 1
    await store.revoke(key.id, by=None)
    await store.refresh()
    assert await store.authenticate(plain) is None


async def test_a_row_the_database_refuses_is_quarantined_and_the_rest_is_written(
    store: AccountStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, _ = await store.create_key("app", "alice")
    db = store._db
    real = db.executemany

    async def picky(sql: str, rows: list[tuple[object, ...]]) -> None:
        if any(r[1] == "poison" for r in rows):
            raise ValueError("refused")
        await real(sql, rows)

    monkeypatch.setattr(db, "executemany", picky)
    for model in ("a", "poison", "b"):
        store.record_usage(key.id, model, 1, 1)
    assert await store.flush() == 2
    ledger = store._ledger
    assert [r[1] for r in ledger.quarantined] == ["poison"] and ledger.pending_rows == 0
    store.record_usage(key.id, "a", 1, 1)  # later flushes are not stuck behind it
    assert await store.flush() == 1
    assert {r.model: r.requests for r in await store.usage(key_id=key.id)} == {"a": 2, "b": 1}


async def test_a_database_that_is_down_keeps_every_row_for_later(
    store: AccountStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, _ = await store.create_key("app", "alice")
    db = store._db
    real_many, real_fetch = db.executemany, db.fetchall

    async def down(*args: object) -> None:
        raise ConnectionError("database down")

    monkeypatch.setattr(db, "executemany", down)
    monkeypatch.setattr(db, "fetchall", down)
    store.record_usage(key.id, "a", 3, 4)
    with pytest.raises(ConnectionError):
        await store._ledger.flush()
    assert store._ledger.pending_rows == 1 and not store._ledger.quarantined
    monkeypatch.setattr(db, "executemany", real_many)
    monkeypatch.setattr(db, "fetchall", real_fetch)
    assert await store.flush() == 1


async def test_a_key_cannot_mint_keys_with_more_than_its_own_limits(store: AccountStore) -> None:
    parent, parent_plain = await store.create_key("p", "alice", requests_per_min=10,
                                                  tokens_per_min=1000)
    child, child_plain = await store.create_key("c", "alice", by=parent)
    assert (child.requests_per_min, child.tokens_per_min) == (10, 1000)
    lower, _ = await store.create_key("l", "alice", requests_per_min=5, by=parent)
    assert (lower.requests_per_min, lower.tokens_per_min) == (5, 1000)
    with pytest.raises(PermissionDenied, match="higher than the creating key"):
        await store.create_key("x", "alice", requests_per_min=11, by=parent)
    # and more keys do not mean more allowance: the owner as a whole keeps 10 requests/min
    assert store.owner_limits("alice") == (10, 1000)
    limiter = RateLimiter(FakeClock())
    plains = [parent_plain, child_plain]
    for _ in range(5):
        plains.append((await store.create_key("k", "alice", by=parent))[1])
    admitted = 0
    for i in range(40):  # round-robin over 7 keys of alice, each allowed 10/min on its own
        k = await store.authenticate(plains[i % len(plains)])
        assert k is not None and k.owner_requests_per_min == 10
        try:
            limiter.check(k)
            admitted += 1
        except RateLimited:
            pass
    assert admitted == 10


async def test_an_owner_limit_on_one_dimension_does_not_free_the_other(
        store: AccountStore) -> None:
    """An admin limits alice's requests only (or sets an empty owner limit); her key with
    1,000 tokens/min mints 5 more keys. Before, the owner row existing meant no pinning: 6
    keys took 6,000 tokens in a minute. Now an owner dimension without a limit is pinned
    to the creator's, so alice as a whole keeps 1,000 tokens/min."""
    for admin_set in ((600, None), (None, None)):
        owner = f"alice{admin_set[0]}"
        await store.set_owner_limits(owner, *admin_set)
        parent, parent_plain = await store.create_key("p", owner, tokens_per_min=1000)
        plains = [parent_plain]
        for _ in range(5):
            plains.append((await store.create_key("k", owner, by=parent))[1])
        assert store.owner_limits(owner) == (admin_set[0], 1000)
        limiter = RateLimiter(FakeClock())
        used = 0
        for _ in range(3):
            for plain in plains:  # each asks for 1,000 tokens within the same minute
                k = await store.authenticate(plain)
                assert k is not None
                try:
                    limiter.check(k)
                except RateLimited:
                    continue
                limiter.add_tokens(k.id, 1000)
                used += 1000
        assert used == 1000


async def test_keys_per_owner_are_capped(accounts_db: str) -> None:
    from llmfabric.accounts.db import open_backend

    store = AccountStore(await open_backend(accounts_db), clock=FakeClock(),
                         max_keys_per_owner=3)
    try:
        await store.refresh()
        first = [await store.create_key(f"k{i}", "bob") for i in range(3)]
        with pytest.raises(PermissionDenied, match="active keys"):
            await store.create_key("k3", "bob")
        await store.revoke(first[0][0].id, by=None)
        await store.create_key("k3", "bob")  # revoking frees a slot
    finally:
        await store.aclose()


async def test_keys_created_at_once_cannot_pass_the_cap(accounts_db: str) -> None:
    """40 creations at once (one POST each) for an owner capped at 3 keys: the cap is
    checked against the cache before the insert awaits the database, so before, every
    one of them passed the check and 40 keys were made."""
    from llmfabric.accounts.db import open_backend

    store = AccountStore(await open_backend(accounts_db), clock=FakeClock(),
                         max_keys_per_owner=3)
    try:
        await store.refresh()
        parent, _ = await store.create_key("p", "bob")
        got = await asyncio.gather(*(store.create_key(f"k{i}", "bob", by=parent)
                                     for i in range(40)), return_exceptions=True)
        made = [g for g in got if not isinstance(g, BaseException)]
        assert len(made) == 2
        assert all(isinstance(g, PermissionDenied) for g in got if g not in made)
        assert len([k for k in await store.list_keys("bob") if k.active]) == 3
    finally:
        await store.aclose()


async def test_made_up_key_ids_cost_a_bounded_number_of_database_lookups(
        store: AccountStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key, 2,000 requests each with a well-formed key of a random id (the cache
    misses, so each used to cost one database query: 2,000, ahead of the ledger's flush on
    the store's one connection). Lookups of unseen ids are rate limited now; a key another
    process created is still found, once the flood has passed."""
    from llmfabric.accounts import keyfmt

    db = store._db
    real = db.fetchall
    lookups = 0

    async def counting(sql: str, params: object = ()) -> list[tuple[object, ...]]:
        nonlocal lookups
        lookups += "WHERE id = ?" in sql
        return await real(sql, params)  # type: ignore[arg-type]

    monkeypatch.setattr(db, "fetchall", counting)
    for _ in range(2000):
        _, fake = keyfmt.new_key()
        assert await store.authenticate(fake) is None
    assert lookups <= 50
    # a key inserted behind the store's back (another process), used after the flood
    key_id, plain = keyfmt.new_key()
    await db.execute(
        "INSERT INTO api_keys (id, key_hash, name, owner, admin, created_at) "
        "VALUES (?, ?, ?, ?, 0, 0)", (key_id, keyfmt.hash_key(plain), "cli", "carol"))
    clock = store._clock
    assert isinstance(clock, FakeClock)
    await clock.advance(5.0)
    assert await store.authenticate(plain) is not None


async def test_an_export_of_one_day_reads_one_day(
        store: AccountStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key asks for one day of its usage (`until` set, or a model) over a 400-day ledger.
    Before, only `since` reached the database: every row since then (or the whole history)
    was read into memory and filtered in Python, per request."""
    import datetime as dt

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from llmfabric.accounts.tenancy_http import add_tenancy_routes

    key, plain = await store.create_key("app", "alice")
    start = dt.date(2025, 1, 1)
    await store._db.executemany(
        "INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, "
        "completion_tokens) VALUES (?, ?, ?, 1, 1, 1)",
        [(key.id, m, (start + dt.timedelta(days=d)).isoformat(), )
         for d in range(400) for m in ("m1", "m2")])
    real = store._db.fetchall
    read = 0

    async def counting(sql: str, params: object = ()) -> list[tuple[object, ...]]:
        nonlocal read
        rows = await real(sql, params)  # type: ignore[arg-type]
        # (rows read; the JSON totals are one aggregate row of their own)
        read += len(rows) if "usage_daily" in sql and "SUM(" not in sql else 0
        return rows

    monkeypatch.setattr(store._db, "fetchall", counting)
    app = web.Application()
    add_tenancy_routes(app, store, None)
    async with TestClient(TestServer(app)) as client:
        for params, want in (({"until": "2025-01-01"}, 2),
                             ({"since": "2025-06-01", "until": "2025-06-01", "model": "m2"}, 1)):
            read = 0
            r = await client.get("/v1/fabric/usage/export", params=params,
                                 headers={"Authorization": f"Bearer {plain}"})
            assert r.status == 200
            assert len((await r.json())["data"]) == want
            assert read == want, params


async def test_a_large_export_is_streamed_in_batches(
        store: AccountStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy owner (or an admin) exports a large ledger. Before, the route read every row
    in one query and built the whole body in memory (200,000 rows: ~200 MiB). Now no query
    reads more than a batch and the body goes out a batch at a time, byte for byte what
    the in-memory export made of the same rows (every filter, both formats)."""
    import datetime as dt

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from llmfabric.accounts import ledger
    from llmfabric.accounts.export import ExportFilter, render
    from llmfabric.accounts.models import UsageRow
    from llmfabric.accounts.tenancy_http import add_tenancy_routes

    _, admin = await store.create_key("ops", "admin", admin=True)
    alice = [(await store.create_key(f"a{i}", "alice"))[0] for i in range(3)]
    bob, bob_plain = await store.create_key("b", "bob")
    start = dt.date(2025, 1, 1)
    models = ("m", "M", "=cmd", "m-1", "zürich \"q\"")
    await store._db.executemany(
        "INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, "
        "completion_tokens, estimated_requests) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(k.id, m, (start + dt.timedelta(days=d)).isoformat(), d + 1, 7 * d, i, d % 2)
         for d in range(40) for i, k in enumerate([*alice, bob]) for m in models]
        + [("remote-key", "m", "2025-01-02", 1, 1, 1, 0)])  # (a key with no owner here)
    monkeypatch.setattr(ledger, "EXPORT_BATCH", 16, raising=False)
    real = store._db.fetchall
    largest = 0

    async def counting(sql: str, params: object = ()) -> list[tuple[object, ...]]:
        nonlocal largest
        rows = await real(sql, params)  # type: ignore[arg-type]
        if "usage_daily" in sql:
            largest = max(largest, len(rows))
        return rows

    async def everything(flt: ExportFilter) -> list[UsageRow]:
        """The rows as the export read them before: one query, in the database's order."""
        where = [c for c, v in (("u.key_id = ?", flt.key_id), ("k.owner = ?", flt.owner),
                                ("u.model = ?", flt.model), ("u.day >= ?", flt.since),
                                ("u.day <= ?", flt.until)) if v is not None]
        got = await real(
            "SELECT u.key_id, COALESCE(k.owner, ''), u.model, u.day, u.requests, "
            "u.prompt_tokens, u.completion_tokens, u.estimated_requests FROM usage_daily u "
            "LEFT JOIN api_keys k ON k.id = u.key_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY u.day, u.key_id, u.model",
            [v for v in (flt.key_id, flt.owner, flt.model, flt.since, flt.until)
             if v is not None])
        return [UsageRow(*(str(v) for v in r[:4]), *(int(v) for v in r[4:]))  # type: ignore[arg-type]
                for r in got]

    monkeypatch.setattr(store._db, "fetchall", counting)
    app = web.Application()
    add_tenancy_routes(app, store, None)
    async with TestClient(TestServer(app)) as client:
        for who, params in ((admin, {}), (admin, {"owner": "alice"}),
                            (admin, {"key_id": alice[1].id}),
                            (admin, {"owner": "bob", "key_id": alice[1].id}),
                            (admin, {"model": "M", "since": "2025-01-05",
                                     "until": "2025-01-30"}),
                            (bob_plain, {"since": "2025-02-01"})):
            for fmt in ("csv", "json"):
                largest = 0
                r = await client.get("/v1/fabric/usage/export",
                                     params={**params, "format": fmt},
                                     headers={"Authorization": f"Bearer {who}"})
                assert r.status == 200, params
                body = await r.read()
                owner = params.get("owner", "bob" if who == bob_plain else None)
                flt = ExportFilter(params.get("key_id"), owner, params.get("model"),
                                   params.get("since"), params.get("until"))
                want, ctype = render(await everything(flt), flt, fmt)
                assert r.content_type == ctype
                assert body == want, (params, fmt)
                assert largest <= 64, (params, fmt, largest)  # (a batch; per key: 64)
                if not params:
                    assert want.count(b"\n" if fmt == "csv" else b'"day"') > 800


async def test_the_admin_owner_name_cannot_be_claimed(store: AccountStore) -> None:
    for name in ("admin", " Admin ", "ADMIN"):
        with pytest.raises(PermissionDenied, match="reserved"):
            await store.create_key("mine", name)
    admin, _ = await store.create_key("ops", "admin", admin=True)
    assert admin.admin and admin.owner == "admin"
    with pytest.raises(Exception, match="printable"):
        await store.create_key("x", "bob\r\nX-Injected: 1")


async def test_flush_task_survives_a_failing_flush_and_still_refreshes(
    accounts_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    store = await AccountStore.open(accounts_db, clock=clock, flush_interval_s=1.0,
                                    refresh_interval_s=2.0)
    try:
        key, plain = await store.create_key("app", "alice")

        async def broken() -> int:
            raise RuntimeError("flush keeps failing")

        monkeypatch.setattr(store._ledger, "flush", broken)
        # revoke behind the store's back (another process), then wait for its refresh
        await store._db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?",
                                (clock.wall(), key.id))
        assert await store.authenticate(plain) is not None  # cached until the refresh
        await clock.advance(5.0)
        await asyncio.sleep(0.05)
        await clock.advance(1.0)
        assert await store.authenticate(plain) is None
        assert store.failures["usage_flush"] >= 1 and not store.failures["key_refresh"]
    finally:
        monkeypatch.undo()
        await store.aclose()
