"""Postgres-specific behaviour of the accounts store, on a throwaway server (conftest.py's
`pg_url`: a fresh database per test; skipped where no server can be started). The checks both
backends share run from test_accounts_store.py, test_accounts_db.py and test_accounts_http.py.

Here: many tasks and many connections upserting the same ledger rows, concurrent first opens
of an empty database, a connection the server drops, connect errors, and the standalone
ingress (`llmfabric ingress --db postgresql://...`) called with the official openai SDK.
"""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import urllib.parse
from typing import Any

import openai
import pytest

from llmfabric.accounts import AccountStore, BackendUnavailable
from llmfabric.net.ports import free_port

from .test_ingress_support import Backend, models_once_up, serve, stop_group

psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[dev]' (psycopg)")
MSG: list[Any] = [{"role": "user", "content": "hi"}]


def _terminate_other_sessions(url: str) -> int:
    """Drop every other connection to this database, as a server restart would."""
    db = urllib.parse.urlsplit(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (db,),
        ).fetchall()
    return len(rows)


async def test_concurrent_tasks_on_one_store_add_up(pg_url: str) -> None:
    """One shared connection, 16 tasks recording and flushing at once: exact totals."""
    async with await AccountStore.open(pg_url, flush_interval_s=0.005) as store:
        keys = [(await store.create_key(f"k{i}", "alice"))[0] for i in range(4)]

        async def worker(n: int) -> None:
            for i in range(50):
                key = keys[(n + i) % len(keys)]
                store.record_usage(key.id, f"m{i % 3}", 2, 3)
                if i % 7 == 0:
                    await store.flush()
                if i % 11 == 0:
                    await store.usage(key_id=key.id)  # reads interleaved with the writes

        await asyncio.gather(*(worker(n) for n in range(16)))
        rows = await store.usage()
    assert len(rows) == 12  # 4 keys x 3 models, one day
    assert sum(r.requests for r in rows) == 16 * 50
    assert sum(r.prompt_tokens for r in rows) == 2 * 16 * 50
    assert sum(r.completion_tokens for r in rows) == 3 * 16 * 50


async def test_many_connections_upsert_same_rows_without_deadlock(pg_url: str) -> None:
    """Six stores (six connections) flush batches touching the same 20 rows, each recorded
    in a different order; flushes write in key order, so none deadlocks and all add up."""
    async with await AccountStore.open(pg_url) as admin:
        keys = [(await admin.create_key(f"k{i}", "bob"))[0] for i in range(20)]
    stores = [await AccountStore.open(pg_url, background=False) for _ in range(6)]
    try:
        async def writer(n: int, store: AccountStore) -> None:
            order = keys if n % 2 else list(reversed(keys))
            for _round in range(10):
                for key in order:
                    store.record_usage(key.id, "m", 1, 1)
                await store.flush()  # raises on a deadlock (the test would fail)

        await asyncio.gather(*(writer(n, s) for n, s in enumerate(stores)))
        rows = await stores[0].usage()
    finally:
        for s in stores:
            await s.aclose()
    assert len(rows) == 20
    assert {r.requests for r in rows} == {6 * 10}


async def test_concurrent_first_opens_create_schema_once(pg_url: str) -> None:
    """Eight processes' worth of stores opening an empty database at the same moment (as
    `llmfabric ingress --workers N` does) all succeed: the schema is created under a lock."""
    stores = await asyncio.gather(
        *(AccountStore.open(pg_url, background=False) for _ in range(8))
    )
    try:
        key, plain = await stores[0].create_key("k", "carol")
        assert await stores[7].authenticate(plain) == key
    finally:
        for s in stores:
            await s.aclose()


async def test_dropped_connection_is_replaced(pg_url: str) -> None:
    async with await AccountStore.open(pg_url, background=False) as store:
        a, _ = await store.create_key("a", "dave")
        assert _terminate_other_sessions(pg_url) == 1
        # Key writes and reads retry once on a fresh connection.
        b, b_plain = await store.create_key("b", "dave")
        assert {k.id for k in await store.list_keys(owner="dave")} == {a.id, b.id}
        assert _terminate_other_sessions(pg_url) == 1
        other = await AccountStore.open(pg_url, background=False)
        c, c_plain = await other.create_key("c", "erin")
        await other.aclose()
        assert await store.authenticate(c_plain) == c  # cache miss -> query -> reconnect
        assert await store.authenticate(b_plain) == b
        # A ledger batch that fails on the dead connection: the database answers again on a
        # fresh connection, so the ledger writes the rows (one by one) in the same flush.
        store.record_usage(b.id, "m", 5, 6)
        assert _terminate_other_sessions(pg_url) == 1
        assert await store.flush() == 1
        assert await store.flush() == 0
        (row,) = await store.usage(key_id=b.id)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1, 5, 6)


async def test_connect_errors_say_what_to_do(pg_url: str) -> None:
    parts = urllib.parse.urlsplit(pg_url)
    no_server = f"postgresql://u:s3cret@127.0.0.1:{free_port()}/x?connect_timeout=5"
    with pytest.raises(BackendUnavailable) as err:
        await AccountStore.open(no_server)
    assert "server is running" in str(err.value) and "s3cret" not in str(err.value)
    missing_db = urllib.parse.urlunsplit(parts._replace(path="/no_such_db"))
    with pytest.raises(BackendUnavailable, match="createdb"):
        await AccountStore.open(missing_db)


async def test_ingress_with_postgres_accounts(pg_url: str, tmp_path: pathlib.Path) -> None:
    """`llmfabric ingress --db postgresql://... --workers 2`, called with the openai SDK: a
    key from the database works, a revoked or unknown one does not, a key's rate limit holds,
    and every request's usage lands in Postgres."""
    async with await AccountStore.open(pg_url, background=False) as store:
        key, plain = await store.create_key("app", "frank")
        gone, gone_plain = await store.create_key("old", "frank")
        await store.revoke(gone.id, by=None)
        slow, slow_plain = await store.create_key("slow", "gina", requests_per_min=1)
    bport, iport = free_port(), free_port()
    runner = await serve(Backend("A").app(), bport)
    log_path = tmp_path / "ingress.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting is quick; we never block on it)
        [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "ingress",
         "--port", str(iport), "--backend", f"m=127.0.0.1:{bport}", "--db", pg_url,
         "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )

    def client(api_key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1", api_key=api_key,
                                  max_retries=0, timeout=10)

    try:
        c = client(plain)
        models = await models_once_up(c, proc)
        assert [m.id for m in models.data] == ["m"]
        replies = await asyncio.gather(
            *(c.chat.completions.create(model="m", messages=MSG) for _ in range(6))
        )
        assert {r.choices[0].message.content for r in replies} == {"hello from A"}
        stream = await c.chat.completions.create(
            model="m", messages=MSG, stream=True, stream_options={"include_usage": True}
        )
        assert "".join([ch.choices[0].delta.content or "" async for ch in stream
                        if ch.choices]) == "A-0 A-1 A-2 A-3 "
        await c.close()
        for bad in (gone_plain, plain[:-1] + ("A" if plain[-1] != "A" else "B")):
            bc = client(bad)
            with pytest.raises(openai.AuthenticationError):
                await bc.chat.completions.create(model="m", messages=MSG)
            await bc.close()
        sc = client(slow_plain)  # 1 request/min in each worker process: 2 at most get in
        outcomes = []
        for _ in range(4):
            try:
                await sc.chat.completions.create(model="m", messages=MSG)
                outcomes.append("ok")
            except openai.RateLimitError:
                outcomes.append("429")
        await sc.close()
        assert 1 <= outcomes.count("ok") <= 2 and "429" in outcomes
    finally:
        stop_group(proc)
        log.close()
        await runner.cleanup()
    assert proc.returncode == 0, log_path.read_text()
    async with await AccountStore.open(pg_url, background=False) as store:
        (row,) = await store.usage(key_id=key.id)
        assert (row.owner, row.model) == ("frank", "m")
        assert (row.requests, row.prompt_tokens, row.completion_tokens) == (7, 7 * 7, 7 * 4)
        assert await store.usage(key_id=gone.id) == []
        (slow_row,) = await store.usage(key_id=slow.id)
        assert slow_row.requests == outcomes.count("ok")


async def test_budgets_stay_in_step_between_ingresses_sharing_postgres(pg_url: str) -> None:
    """Two ingresses on one Postgres database (each its own account store and budget book):
    a budget set at one holds at the other after its sync, and so does what one spent."""
    import time

    from llmfabric.accounts.budgets import Budget, BudgetBook, BudgetStore, Hold, OverBudget

    a = await AccountStore.open(pg_url, background=False)
    b = await AccountStore.open(pg_url, background=False)
    try:
        key, _ = await a.create_key("app", "hana")
        ba = BudgetStore(a.backend, BudgetBook(time.time), a.ledger)
        bb = BudgetStore(b.backend, BudgetBook(time.time), b.ledger)
        await ba.load()
        await bb.load()
        await ba.put(Budget("owner", "hana", 100, "day"))
        await bb.sync()
        hold = bb.book.reserve(key.id, "hana", 60)
        assert isinstance(hold, Hold)
        b.record_usage(key.id, "m", 60, 0)
        bb.book.settle(hold, 60)
        await b.flush()
        await ba.sync()
        refused = ba.book.reserve(key.id, "hana", 50)
        assert isinstance(refused, OverBudget) and refused.spent == 60
        assert isinstance(ba.book.reserve(key.id, "hana", 40), Hold)
    finally:
        await a.aclose()
        await b.aclose()
