"""Accounts on a real database: hashing at rest, durability of the ledger, many writer
processes, the keys CLI. Most checks run on both backends (`accounts_db`: a SQLite file and a
fresh Postgres database); the file-level check is SQLite's own."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import sqlite3
import sys
import textwrap
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from llmfabric.accounts import AccountStore
from llmfabric.cli.apikeys import API_KEY_COMMANDS


def _files(folder: pathlib.Path) -> list[bytes]:
    return [p.read_bytes() for p in folder.iterdir()]


async def test_plaintext_never_reaches_disk(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "acc.db"
    async with await AccountStore.open(f"sqlite:///{db}") as store:
        keys = [await store.create_key(f"k{i}", "alice") for i in range(5)]
    for data in _files(tmp_path):  # the db, and any -wal/-shm left behind
        for _key, plain in keys:
            assert plain.encode() not in data
            assert plain[20:].encode() not in data  # not even the secret part
    async with await AccountStore.open(str(db)) as store:
        for key, plain in keys:
            assert await store.authenticate(plain) == key


async def test_plaintext_never_stored(accounts_db: str) -> None:
    async with await AccountStore.open(accounts_db) as store:
        keys = [await store.create_key(f"k{i}", "alice") for i in range(3)]
        stored = repr(await store._db.fetchall("SELECT * FROM api_keys"))
    for key, plain in keys:
        assert key.id in stored
        assert plain not in stored and plain[20:] not in stored


async def test_usage_flushed_by_background_task_and_on_close(accounts_db: str) -> None:
    db = accounts_db
    store = await AccountStore.open(db, flush_interval_s=0.05)
    key, _ = await store.create_key("k", "alice")
    store.record_usage(key.id, "m", 3, 4)
    for _ in range(200):  # the periodic task writes it without anyone asking
        await asyncio.sleep(0.01)
        probe = await AccountStore.open(db, background=False)
        rows = await probe._ledger.query()
        await probe.aclose()
        if rows:
            break
    assert [(r.prompt_tokens, r.completion_tokens) for r in rows] == [(3, 4)]
    for _ in range(100):
        store.record_usage(key.id, "m", 1, 1)
    await store.aclose()  # clean shutdown flushes the rest
    async with await AccountStore.open(db) as reopened:
        (row,) = await reopened.usage(key_id=key.id)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (101, 103, 104)


@contextlib.contextmanager
def _write_lock(url: str) -> Iterator[None]:
    """Hold the ledger table's write lock from another connection while the block runs."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, connect_timeout=10) as pg:
            pg.execute("LOCK TABLE usage_daily IN EXCLUSIVE MODE")
            yield
            pg.commit()
        return
    lite = sqlite3.connect(url, isolation_level=None, timeout=10)
    try:
        lite.execute("BEGIN IMMEDIATE")
        yield
        lite.execute("COMMIT")
    finally:
        lite.close()


async def test_flush_cancelled_mid_write_counts_once(accounts_db: str) -> None:
    """A flush whose caller is cancelled while the write waits on a lock (a shutdown, a
    dropped HTTP client) still writes its batch exactly once."""
    store = await AccountStore.open(accounts_db, background=False)
    key, _ = await store.create_key("k", "alice")
    store.record_usage(key.id, "m", 1, 2)
    await store.flush()
    store.record_usage(key.id, "m", 10, 20)
    with _write_lock(accounts_db):
        flush = asyncio.create_task(store.flush())
        await asyncio.sleep(0.2)  # the write is waiting for the lock now (or soon)
        assert not flush.done()
        flush.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flush
    store.record_usage(key.id, "m", 100, 200)
    await store.aclose()  # waits for the write in flight, then flushes the rest
    async with await AccountStore.open(accounts_db) as reopened:
        (row,) = await reopened.usage(key_id=key.id)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (3, 111, 222)


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from llmfabric.accounts import AccountStore

    async def main(db, key_id, n):
        store = await AccountStore.open(db, flush_interval_s=0.001)
        for i in range(n):
            store.record_usage(key_id, "m", 1, 2)
            if i % 10 == 0:
                await asyncio.sleep(0.002)
        await store.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


async def test_concurrent_writer_processes_add_up(accounts_db: str) -> None:
    db = accounts_db
    async with await AccountStore.open(db) as store:
        key, _ = await store.create_key("k", "alice")
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", _WRITER, db, key.id, "300")
        for _ in range(3)
    ]
    # This process writes too, through two stores of its own.
    a = await AccountStore.open(db, flush_interval_s=0.001)
    b = await AccountStore.open(db, flush_interval_s=0.001)
    for i in range(300):
        (a if i % 2 else b).record_usage(key.id, "m", 1, 2)
        if i % 10 == 0:
            await asyncio.sleep(0.002)
    await a.aclose()
    await b.aclose()
    for p in procs:
        assert await asyncio.wait_for(p.wait(), 60) == 0
    async with await AccountStore.open(db) as store:
        (row,) = await store.usage()
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (1200, 1200, 2400)


def test_cli_create_list_revoke(tmp_path: pathlib.Path, accounts_db: str) -> None:
    import json

    cmds = {c.name: c for c in API_KEY_COMMANDS}
    runner = CliRunner()
    # A SQLite accounts_db is <tmp_path>/accounts.db: the default under LLMFABRIC_HOME.
    sqlite = not accounts_db.startswith("postgresql://")
    env = {"LLMFABRIC_HOME": str(tmp_path), "LLMFABRIC_DB": None if sqlite else accounts_db}
    out = runner.invoke(cmds["create"], ["--name", "app", "--owner", "bob", "--rpm", "5",
                                         "--json"], env=env)
    assert out.exit_code == 0, out.output
    created = json.loads(out.output)
    assert created["key"].startswith("lf-") and created["requests_per_min"] == 5
    assert (tmp_path / "accounts.db").exists() == sqlite
    listed = runner.invoke(cmds["list"], ["--json"], env=env)
    assert [k["id"] for k in json.loads(listed.output)] == [created["id"]]
    assert created["key"] not in listed.output
    table = runner.invoke(cmds["list"], [], env=env)
    assert created["id"] in table.output
    rev = runner.invoke(cmds["revoke"], [created["id"]], env=env)
    assert rev.exit_code == 0 and "revoked" in rev.output
    assert json.loads(runner.invoke(cmds["list"], ["--json"], env=env).output) == []
    assert len(json.loads(runner.invoke(cmds["list"], ["--json", "--all"], env=env).output)) == 1
    missing = runner.invoke(cmds["revoke"], ["0000000000000000"], env=env)
    assert missing.exit_code != 0 and "no API key" in missing.output
