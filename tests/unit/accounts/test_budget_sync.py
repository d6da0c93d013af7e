"""Budgets over one accounts database shared by several processes (the workers of
`llmfabric ingress --workers N`, ingresses sharing Postgres): `BudgetStore.sync()` brings
each process's book in step with what the others set and spent. Two stores on one real
SQLite file stand for two processes; flushes and syncs are called explicitly, on a fake
clock, so every step is deterministic."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.accounts.budgets import Budget, BudgetBook, BudgetStore, Hold, OverBudget
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.prices import validate_price
from llmfabric.accounts.store import AccountStore
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.poll import wait_until

pytestmark = pytest.mark.unit

NOON = 1_774_958_400.0  # 2026-03-31 12:00 UTC


class Process:
    """One ingress process: its account store (ledger) and its budget store."""

    def __init__(self, store: AccountStore, clock: FakeClock) -> None:
        self.store = store
        self.budgets = BudgetStore(store.backend, BudgetBook(clock.wall), store.ledger)

    def serve(self, key: ApiKey, tokens: int) -> Hold | OverBudget:
        """Admit a request of `tokens` (reserved = used) and, if admitted, end it: settle
        the budgets and record the usage, as the gate and the usage sink do."""
        got = self.budgets.book.reserve(key.id, key.owner, tokens,
                                        issuer=key.issuer)
        if isinstance(got, Hold):
            self.store.record_usage(key.id, "m", tokens, 0)
            self.budgets.book.settle(got, tokens)
        return got

    def spent(self, scope: str = "owner", name: str = "alice") -> int:
        for row in self.budgets.book.status():
            if (row["scope"], row["name"]) == (scope, name):
                return int(str(row["spent"]))
        raise AssertionError(f"no budget {scope}/{name} here")


@contextlib.asynccontextmanager
async def _two(tmp_path: Path) -> AsyncIterator[tuple[Process, Process, ApiKey, FakeClock]]:
    """Two processes on one SQLite file, both with their books loaded; closed after."""
    clock = FakeClock(wall_start=NOON)
    url = f"sqlite:///{tmp_path / 'accounts.db'}"
    a = await AccountStore.open(url, clock=clock, background=False)
    b = await AccountStore.open(url, clock=clock, background=False)
    try:
        key, _ = await a.create_key("app", "alice")
        pa, pb = Process(a, clock), Process(b, clock)
        await pa.budgets.load()
        await pb.budgets.load()
        yield pa, pb, key, clock
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_budget_set_in_one_process_holds_in_the_other(tmp_path: Path) -> None:
    async with _two(tmp_path) as (a, b, key, _):
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        assert not b.budgets.book.applies(key.id, "alice")  # (before: never, until restart)
        await b.budgets.sync()
        assert b.budgets.book.applies(key.id, "alice")
        await a.budgets.put(Budget("owner", "alice", 50, "day"))  # changed...
        await b.budgets.put_team("alice", "nlp")
        await b.budgets.put_price("m", validate_price("m", 1.0, 2.0))
        await a.budgets.sync()
        await b.budgets.sync()
        assert b.budgets.book.budgets[("owner", "alice")].limit == 50
        assert a.budgets.book.teams == {"alice": "nlp"} and "m" in a.budgets.book.prices
        await b.budgets.put(Budget("key", key.id, 10, "day"))
        assert await a.budgets.delete("key", key.id)  # set by b since a's last sync
        assert not await a.budgets.delete("key", key.id)
        assert await a.budgets.delete("owner", "alice")  # ...and removed
        await b.budgets.sync()
        assert not b.budgets.book.applies(key.id, "alice")


async def test_spending_in_one_process_counts_in_the_other(tmp_path: Path) -> None:
    async with _two(tmp_path) as (a, b, key, _):
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        await b.budgets.sync()
        assert isinstance(a.serve(key, 30), Hold)
        assert isinstance(b.serve(key, 30), Hold)
        # Not written yet: each counts its own settled spending, never loses it to a sync.
        await a.budgets.sync()
        assert a.spent() == 30
        await a.store.flush()
        await b.store.flush()
        await a.budgets.sync()
        await b.budgets.sync()
        assert a.spent() == b.spent() == 60  # written, counted once
        assert isinstance(a.serve(key, 30), Hold)  # 90
        await a.store.flush()
        await b.budgets.sync()
        assert b.spent() == 90
        refused = b.serve(key, 20)  # 110 > 100: refused, although b itself spent only 30
        assert isinstance(refused, OverBudget) and refused.spent == 90
        assert isinstance(b.serve(key, 10), Hold)


async def test_without_sync_two_processes_each_spend_the_whole_budget(tmp_path: Path) -> None:
    """What the sync prevents: the books alone admit a budget's worth each."""
    async with _two(tmp_path) as (a, b, key, _):
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        await b.budgets.load()  # as a process started after the budget was set
        admitted = sum(isinstance(p.serve(key, 50), Hold) for p in (a, b, a, b, a, b))
        assert admitted == 4  # 200 tokens against a budget of 100


async def test_a_team_budget_counts_members_spending_in_other_processes(
        tmp_path: Path) -> None:
    async with _two(tmp_path) as (a, b, key, _):
        bob, _ = await a.store.create_key("bob-app", "bob")
        await a.budgets.put(Budget("team", "nlp", 100, "day"))
        await a.budgets.put_team("alice", "nlp")
        await a.budgets.put_team("bob", "nlp")
        await b.budgets.sync()
        assert isinstance(b.serve(bob, 70), Hold)
        await b.store.flush()
        await a.budgets.sync()
        assert a.spent("team", "nlp") == 70
        assert isinstance(a.serve(key, 40), OverBudget)


async def test_keys_another_ingress_issued_count_for_their_owner(tmp_path: Path) -> None:
    """A key accepted through another ingress's grant is not in this database, so the
    ledger cannot tell its owner: the book keeps its owner's and team's spending itself
    (a sync must not drop it once the ledger batch is written)."""
    import dataclasses

    async with _two(tmp_path) as (a, _b, key, _):
        remote = dataclasses.replace(key, id="kremote0000000001", issuer="ingress-b")
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        await a.budgets.put(Budget("key", remote.id, 1000, "day"))
        admitted = 0
        for _ in range(5):
            if isinstance(a.serve(remote, 40), Hold):
                admitted += 1
            await a.store.flush()
            await a.budgets.sync()
        assert admitted == 2 and a.spent() == 80
        assert a.spent("key", remote.id) == 80  # (the ledger has it by key id, once)
        assert await a.budgets.delete("owner", "alice")
        await a.budgets.sync()
        assert [r["scope"] for r in a.budgets.book.status()] == ["key"]
        await a.budgets.put(Budget("owner", "alice", 100, "day"))  # back the same day:
        await a.budgets.sync()
        assert a.spent() == 80  # what the remote key spent today still counts


async def test_a_failed_flush_keeps_settled_spending_counted(tmp_path: Path) -> None:
    """A batch that fails goes out again with the next one: until that one is written the
    process keeps counting what it settled."""
    async with _two(tmp_path) as (a, b, key, _):
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        assert isinstance(a.serve(key, 40), Hold)
        real = a.store.backend.executemany

        async def broken(sql: str, rows: object) -> None:
            raise OSError("disk gone")

        a.store.backend.executemany = broken  # type: ignore[method-assign]
        reachable = a.store.ledger._reachable

        async def unreachable() -> bool:
            return False

        a.store.ledger._reachable = unreachable  # type: ignore[method-assign]
        with pytest.raises(OSError):
            await a.store.flush()
        await a.budgets.sync()
        assert a.spent() == 40  # not in the database, still counted here
        a.store.backend.executemany = real  # type: ignore[method-assign]
        a.store.ledger._reachable = reachable  # type: ignore[method-assign]
        await a.store.flush()
        await a.budgets.sync()
        await b.budgets.sync()
        assert a.spent() == b.spent() == 40  # written once, counted once


async def test_a_sync_does_not_undo_a_change_made_while_it_read(tmp_path: Path) -> None:
    async with _two(tmp_path) as (a, b, key, _):
        gate = asyncio.Event()
        real = a.store.backend.fetchall
        started = asyncio.Event()

        async def slow(sql: str, params: object = ()) -> object:
            if "FROM budgets" in sql:
                started.set()
                await gate.wait()
            return await real(sql, params)  # type: ignore[arg-type]

        a.store.backend.fetchall = slow  # type: ignore[assignment]
        sync = asyncio.create_task(a.budgets.sync())
        await started.wait()  # the sync has read prices and teams, and waits on budgets
        a.store.backend.fetchall = real  # type: ignore[method-assign]
        await b.budgets.put(Budget("owner", "alice", 100, "day"))  # another process
        await a.budgets.put(Budget("key", key.id, 10, "day"))  # this one, meanwhile
        gate.set()
        await sync
        assert ("key", key.id) in a.budgets.book.budgets  # kept
        await a.budgets.sync()
        assert set(a.budgets.book.budgets) == {("key", key.id), ("owner", "alice")}


async def test_run_sync_counts_and_survives_failures(tmp_path: Path) -> None:
    async with _two(tmp_path) as (a, b, _, clock):
        failures: Counter[str] = Counter()
        real = a.store.backend.fetchall
        calls = 0

        async def flaky(sql: str, params: object = ()) -> object:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise OSError("connection reset")
            return await real(sql, params)  # type: ignore[arg-type]

        a.store.backend.fetchall = flaky  # type: ignore[assignment]
        task = asyncio.create_task(a.budgets.run_sync(clock.sleep, 2.0, failures))
        await b.budgets.put(Budget("owner", "alice", 100, "day"))
        assert a.budgets.sync_age_s() == 0.0  # (loaded just now)
        await clock.advance(2.0)
        await wait_until(lambda: failures["budget_sync"] == 1, 5, "the failed sync counted")
        assert a.budgets.sync_age_s() == 2.0  # the gauge an operator alerts on
        await clock.advance(2.0)
        await wait_until(lambda: a.budgets.syncs == 1, 5, "the next tick's sync")
        assert a.budgets.sync_age_s() == 0.0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert failures == {"budget_sync": 1} and a.budgets.syncs >= 1
        assert ("owner", "alice") in a.budgets.book.budgets


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 40),
                          st.sampled_from(["serve", "flush", "sync"])), max_size=40))
def test_after_a_sync_a_book_holds_the_database_plus_what_it_has_not_written(
        ops: list[tuple[int, int, str]]) -> None:
    """Law: after any interleaving of requests, flushes and syncs in two processes, a sync
    leaves its book's `spent` at exactly the ledger's total plus what that process settled
    and has not written (nothing lost, nothing counted twice), and once both flush and sync
    both books equal the database."""
    async def run() -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            async with _two(Path(d)) as (a, b, key, _):
                async def in_db() -> int:  # (store.usage() would flush first)
                    return sum(r.prompt_tokens for r in await a.store.ledger.query())

                await a.budgets.put(Budget("owner", "alice", 100, "day"))
                await b.budgets.sync()
                procs = (a, b)
                unwritten = [0, 0]
                for who, tokens, op in ops:
                    p = procs[who]
                    if op == "serve":
                        if isinstance(p.serve(key, tokens), Hold):
                            unwritten[who] += tokens
                    elif op == "flush":
                        await p.store.flush()
                        unwritten[who] = 0
                    else:
                        await p.budgets.sync()
                        assert p.spent() == await in_db() + unwritten[who]
                for p in procs:
                    await p.store.flush()
                for p in procs:
                    await p.budgets.sync()
                assert a.spent() == b.spent() == await in_db()

    asyncio.run(run())


def test_the_keys_budget_cli_sets_lists_and_removes_budgets_teams_and_prices(
        tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llmfabric.cli.keys import keys_group

    db = ["--db", str(tmp_path / "acc.db")]
    run = CliRunner().invoke
    out = run(keys_group, ["budget", "set", "owner", "alice", "--tokens", "500", *db])
    assert out.exit_code == 0 and "at most 500 tokens (prompt + completion) per UTC day" in \
        out.output
    out = run(keys_group, ["budget", "set", "team", "nlp", "--usd", "2.5", "--period", "month",
                           *db])
    assert out.exit_code == 0 and "at most $2.5 of spend" in out.output
    for bad in (["owner", "bob"], ["owner", "bob", "--tokens", "1", "--usd", "1"],
                ["group", "x", "--tokens", "1"], ["owner", "bob", "--tokens", "0"]):
        out = run(keys_group, ["budget", "set", *bad, *db])
        assert out.exit_code == 2, (bad, out.output)
    assert run(keys_group, ["budget", "team", "alice", "nlp", *db]).exit_code == 0
    assert run(keys_group, ["budget", "team", "bob", "nlp", *db]).exit_code == 0
    assert run(keys_group, ["budget", "team", "bob", "--remove", *db]).exit_code == 0
    out = run(keys_group, ["budget", "team", "bob", "--remove", *db])
    assert out.exit_code == 1 and "in no team" in out.output
    for bad in (["carol"], ["carol", "x", "--remove"], ["carol", "x" * 201]):
        assert run(keys_group, ["budget", "team", *bad, *db]).exit_code == 2, bad
    out = run(keys_group, ["budget", "price", "m", "--prompt-usd", "0.6", "--completion-usd",
                           "0.8", *db])
    assert out.exit_code == 0 and "$0.6 / $0.8" in out.output
    for bad in (["m", "--prompt-usd", "1"], ["m", "--prompt-usd", "-1", "--completion-usd", "1"],
                ["m", "--remove", "--prompt-usd", "1"]):
        assert run(keys_group, ["budget", "price", *bad, *db]).exit_code == 2, bad
    assert run(keys_group, ["budget", "price", "gone", "--remove", *db]).exit_code == 1
    out = run(keys_group, ["budget", "list", "--json", *db])
    assert out.exit_code == 0
    got = json.loads(out.output)
    rows = {(r["scope"], r["name"]): r for r in got["budgets"]}
    assert rows[("owner", "alice")]["tokens"] == 500 and rows[("team", "nlp")]["usd"] == 2.5
    assert got["teams"] == {"alice": "nlp"}
    assert got["prices"]["m"] == {"prompt_usd_per_mtok": 0.6, "completion_usd_per_mtok": 0.8}
    assert run(keys_group, ["budget", "price", "m", "--remove", *db]).exit_code == 0
    assert run(keys_group, ["budget", "rm", "owner", "alice", *db]).exit_code == 0
    out = run(keys_group, ["budget", "rm", "owner", "alice", *db])
    assert out.exit_code == 1 and "no budget for owner 'alice'" in out.output
    out = run(keys_group, ["budget", "list", *db])
    assert "owner  alice" not in out.output and "team   nlp" in out.output
    assert "member alice" in out.output


async def test_a_sync_reads_many_budgets_in_few_queries(tmp_path: Path) -> None:
    """450 key budgets, 2 owner budgets and a team budget: one ledger query per scope and
    period for up to 400 names, and every total right."""
    async with _two(tmp_path) as (a, b, key, _):
        bob, _ = await a.store.create_key("bob-app", "bob")
        await a.budgets.put_team("bob", "nlp")
        for i in range(449):
            await a.budgets.put(Budget("key", f"kx{i:04d}", 10, "day"))
        await a.budgets.put(Budget("key", key.id, 1000, "day"))
        await a.budgets.put(Budget("owner", "alice", 1000, "day"))
        await a.budgets.put(Budget("owner", "bob", 1000, "month"))
        await a.budgets.put(Budget("team", "nlp", 1000, "day"))
        for k, n in ((key, 30), (bob, 7), (key, 5)):
            assert isinstance(b.serve(k, n), Hold)
        await b.store.flush()
        queries: list[str] = []
        real = a.store.backend.fetchall

        async def counted(sql: str, params: object = ()) -> object:
            if "usage_daily" in sql:
                queries.append(sql)
            return await real(sql, params)  # type: ignore[arg-type]

        a.store.backend.fetchall = counted  # type: ignore[assignment]
        await a.budgets.sync()
        # keys: 2 chunks; owners: day and month; team: 1
        assert len(queries) == 5, queries
        assert a.spent("key", key.id) == 35 and a.spent("owner", "alice") == 35
        assert a.spent("owner", "bob") == 7 and a.spent("team", "nlp") == 7
        assert a.spent("key", "kx0000") == 0


async def test_rows_no_version_wrote_are_skipped_not_fatal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The tables are shared with other processes and programs: a row that is not valid
    (written by hand, or by a buggy tool) is skipped with one warning, and every other
    budget, team and price still loads and syncs (before: load raised, so the ingress did
    not start, or every later sync failed)."""
    async with _two(tmp_path) as (a, b, key, _):
        await a.budgets.put(Budget("owner", "alice", 100, "day"))
        await a.budgets.put_team("alice", "nlp")
        await a.budgets.put_price("m", validate_price("m", 1.0, 2.0))
        db = a.store.backend
        for row in (("owner", "bob", 100, "week", "tokens"), ("group", "x", 5, "day", "tokens"),
                    ("key", "k", -5, "day", "tokens"), ("key", "k2", 5, "day", "coins"),
                    ("owner", "", 5, "day", "tokens")):
            await db.execute("INSERT INTO budgets (scope, name, amount, period, unit) "
                             "VALUES (?, ?, ?, ?, ?)", row)
        await db.execute("INSERT INTO owner_teams (owner, team) VALUES ('carol', '')")
        await db.execute("INSERT INTO model_prices (model, prompt_usd_per_mtok, "
                         "completion_usd_per_mtok) VALUES ('bad', -1, 2)")
        fresh = Process(b.store, FakeClock(wall_start=NOON))
        await fresh.budgets.load()  # a process starting now
        for _ in range(2):
            await fresh.budgets.sync()
        book = fresh.budgets.book
        assert set(book.budgets) == {("owner", "alice")}
        assert book.teams == {"alice": "nlp"} and set(book.prices) == {"m"}
        warned = [r for r in caplog.records if "not valid" in r.getMessage()]
        assert len(warned) == 7  # once per bad row, not once per sync
        assert isinstance(fresh.serve(key, 60), Hold)  # the good budget is enforced
        assert isinstance(fresh.serve(key, 60), OverBudget)
