"""Token budgets: reservations make concurrent requests unable to overspend, refusals carry
the wait until the period renews, settling charges what was used."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.accounts.budgets import (
    Budget,
    BudgetBook,
    BudgetStore,
    Hold,
    OverBudget,
    period_of,
    validate_budget,
)
from llmfabric.accounts.db import open_backend
from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.prices import validate_price

pytestmark = pytest.mark.unit

NOON = dt.datetime(2026, 3, 31, 12, 0, tzinfo=dt.UTC).timestamp()


def test_periods_and_their_renewal() -> None:
    assert period_of("day", NOON) == (
        "2026-03-31", dt.datetime(2026, 4, 1, tzinfo=dt.UTC).timestamp())
    assert period_of("month", NOON) == (
        "2026-03", dt.datetime(2026, 4, 1, tzinfo=dt.UTC).timestamp())
    dec = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    assert period_of("month", dec)[1] == dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()


def test_concurrent_reservations_never_overspend_and_refusal_waits_until_renewal() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "alice", 1000, "day"))
    holds = [book.reserve(f"k{i % 3}", "alice", 300) for i in range(10)]
    admitted = [h for h in holds if isinstance(h, Hold)]
    refused = [h for h in holds if isinstance(h, OverBudget)]
    assert len(admitted) == 3 and len(refused) == 7  # 3 x 300 fit in 1000, a 4th does not
    assert refused[0].retry_after_s == 12 * 3600  # until midnight UTC
    assert "alice" in refused[0].message() and "1000" in refused[0].message()
    # other owners are not affected
    assert isinstance(book.reserve("kb", "bob", 10**6), Hold)
    # settling to the real (smaller) use frees the rest of the reservation
    for h in admitted:
        assert isinstance(h, Hold)
        book.settle(h, 100)
        book.settle(h, 100)  # idempotent
    assert book.status()[0]["spent"] == 300 and book.status()[0]["held"] == 0
    assert isinstance(book.reserve("k0", "alice", 700), Hold)
    assert isinstance(book.reserve("k0", "alice", 1), OverBudget)


def test_key_and_owner_budgets_both_apply() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k1", 100, "month"))
    book.set(Budget("owner", "alice", 10_000, "day"))
    h = book.reserve("k1", "alice", 80)
    assert isinstance(h, Hold) and len(h.parts) == 2
    refused = book.reserve("k1", "alice", 30)
    assert isinstance(refused, OverBudget) and refused.budget.scope == "key"
    assert isinstance(book.reserve("k2", "alice", 30), Hold)  # another key of alice


def test_a_request_larger_than_the_budget_runs_alone_at_the_start() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("key", "k", 100, "day"))
    h = book.reserve("k", "o", 10**9)
    assert isinstance(h, Hold)
    book.settle(h, 150)  # it really used more than the budget
    assert isinstance(book.reserve("k", "o", 1), OverBudget)


def test_the_next_period_starts_fresh() -> None:
    now = [NOON]
    book = BudgetBook(lambda: now[0])
    book.set(Budget("key", "k", 10, "day"))
    h = book.reserve("k", "o", 10)
    assert isinstance(h, Hold)
    book.settle(h, 10)
    assert isinstance(book.reserve("k", "o", 1), OverBudget)
    now[0] += 12 * 3600
    assert isinstance(book.reserve("k", "o", 10), Hold)


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 600), st.booleans()),
                max_size=60))
def test_spent_plus_held_never_exceeds_the_budget_before_settlement(
        ops: list[tuple[int, int, bool]]) -> None:
    """Law: whatever the interleaving of reserves and settles (with use <= reservation),
    settled + held tokens stay within the budget."""
    book = BudgetBook(lambda: NOON)
    book.set(Budget("owner", "o", 1000, "day"))
    open_holds: list[tuple[Hold, int]] = []
    for est, used, settle_first in ops:
        if settle_first and open_holds:
            h, n = open_holds.pop(0)
            book.settle(h, min(used, n))
        got = book.reserve("k", "o", est)
        if isinstance(got, Hold):
            open_holds.append((got, est))
        row = book.status()[0]
        assert int(str(row["spent"])) + int(str(row["held"])) <= 1000


@pytest.mark.parametrize("args", [
    ("group", "x", 10, "day"), ("key", "x", 0, "day"), ("key", "x", 10, "week"),
    ("key", "", 10, "day"), ("key", "x", True, "day"), ("owner", "x" * 201, 10, "month"),
])
def test_invalid_budgets_are_refused(args: tuple[str, str, int, str]) -> None:
    with pytest.raises(InvalidRequest):
        validate_budget(*args)


async def test_budget_store_persists_and_seeds_spending_from_the_ledger() -> None:
    db = await open_backend("sqlite://:memory:")
    try:
        from llmfabric.accounts.store import AccountStore

        store = AccountStore(db)
        await store.refresh()
        key, _ = await store.create_key("app", "alice")
        today = period_of("day", dt.datetime.now(dt.UTC).timestamp())[0]
        await db.execute(
            "INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, "
            "completion_tokens, estimated_requests) VALUES (?, 'm', ?, 3, 40, 20, 0)",
            (key.id, today))
        import time

        bs = BudgetStore(db, BudgetBook(time.time))
        await bs.load()
        await bs.put(Budget("owner", "alice", 100, "day"))
        again = BudgetStore(db, BudgetBook(time.time))
        await again.load()  # a restarted ingress
        [row] = again.book.status()
        assert row["tokens"] == 100 and row["spent"] == 60
        assert isinstance(again.book.reserve(key.id, "alice", 41), OverBudget)
        assert await again.delete("owner", "alice") and not await again.delete("owner", "x")
    finally:
        await db.aclose()


def test_spend_budgets_charge_each_model_at_its_price() -> None:
    book = BudgetBook(lambda: NOON)
    book.prices["big"] = validate_price("big", 10.0, 30.0)  # USD per million tokens
    book.set(validate_budget("owner", "alice", None, "day", usd=0.01))  # 10_000 micro-USD
    assert book.cost_micros("big", 100, 100) == 4000
    assert book.cost_micros("unpriced", 10**6, 10**6) == 0
    h = book.reserve("k", "alice", 200, book.cost_micros("big", 100, 100))
    assert isinstance(h, Hold)
    book.settle(h, 150, book.cost_micros("big", 100, 50))  # used less: 2500
    h2 = book.reserve("k", "alice", 200, 7000)
    assert isinstance(h2, Hold)
    refused = book.reserve("k", "alice", 1, 600)  # 2500 spent + 7000 held + 600 > 10_000
    assert isinstance(refused, OverBudget)
    assert "spend budget" in refused.message() and "$0.01" in refused.message()
    row = book.status()[0]
    assert row["usd"] == 0.01 and row["spent"] == 2500 and row["held"] == 7000
    # "*" prices every model without a price of its own
    book.prices["*"] = validate_price("*", 1.0, 1.0)
    assert book.cost_micros("unpriced", 10**6, 0) == 10**6


@pytest.mark.parametrize("prompt,completion", [
    (-1, 1), (1, float("nan")), (float("inf"), 1), (True, 1), ("1", 1), (1, 2e6), (None, 1)])
def test_hostile_prices_are_refused(prompt: object, completion: object) -> None:
    with pytest.raises(InvalidRequest):
        validate_price("m", prompt, completion)


@pytest.mark.parametrize("kw", [{"usd": -1.0}, {"usd": float("nan")}, {"usd": 1e10},
                                {"usd": True}])
def test_hostile_spend_budgets_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        validate_budget("owner", "x", None, "day", **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):  # tokens and usd together
        validate_budget("owner", "x", 5, "day", usd=1.0)


def test_a_teams_budget_counts_every_key_of_its_owners() -> None:
    book = BudgetBook(lambda: NOON)
    book.set(Budget("team", "nlp", 1000, "day"))
    book.set(Budget("owner", "alice", 700, "day"))
    book.teams.update(alice="nlp", bob="nlp")
    a = book.reserve("ka", "alice", 600)  # alice's key: her budget and her team's
    assert isinstance(a, Hold) and {k[:2] for k, _, _ in a.parts} == {
        ("owner", "alice"), ("team", "nlp")}
    refused = book.reserve("kb", "bob", 500)  # bob has no budget of his own: the team's binds
    assert isinstance(refused, OverBudget) and refused.budget.scope == "team"
    assert "team 'nlp'" in refused.message()
    assert isinstance(book.reserve("kb", "bob", 400), Hold)
    assert isinstance(book.reserve("kc", "carol", 10**6), Hold)  # in no team: not counted
    book.settle(a, 100)
    [team] = [r for r in book.status() if r["scope"] == "team"]
    assert team["spent"] == 100 and team["held"] == 400


async def test_team_memberships_persist_and_seed_the_teams_spending() -> None:
    import time

    from llmfabric.accounts.store import AccountStore

    db = await open_backend("sqlite://:memory:")
    try:
        store = AccountStore(db)
        await store.refresh()
        ka, _ = await store.create_key("app", "alice")
        kb, _ = await store.create_key("app", "bob")
        kc, _ = await store.create_key("app", "carol")
        today = period_of("day", dt.datetime.now(dt.UTC).timestamp())[0]
        for key, tokens in ((ka, 30), (kb, 40), (kc, 1000)):
            await db.execute(
                "INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, "
                "completion_tokens, estimated_requests) VALUES (?, 'm', ?, 1, ?, 0, 0)",
                (key.id, today, tokens))
        bs = BudgetStore(db, BudgetBook(time.time))
        await bs.load()
        await bs.put(Budget("team", "nlp", 100, "day"))
        await bs.put_team("alice", "nlp")
        await bs.put_team("bob", "nlp")
        with pytest.raises(InvalidRequest):
            await bs.put_team("alice", "")
        again = BudgetStore(db, BudgetBook(time.time))
        await again.load()  # a restarted ingress: alice's and bob's use, not carol's
        assert again.book.teams == {"alice": "nlp", "bob": "nlp"}
        [row] = again.book.status()
        assert row["scope"] == "team" and row["spent"] == 70
        assert isinstance(again.book.reserve(kb.id, "bob", 31), OverBudget)
        assert await again.delete_team("bob") and not await again.delete_team("bob")
        assert isinstance(again.book.reserve(kb.id, "bob", 31), Hold)  # no longer counted
    finally:
        await db.aclose()


def test_a_team_budget_applies_to_every_owner_in_the_team() -> None:
    book = BudgetBook(lambda: 0.0)
    book.teams["alice"] = "nlp"
    assert not book.applies("k1", "alice")
    book.set(Budget("team", "nlp", 100, "day"))
    assert book.applies("k1", "alice")  # (the ingress's fast path must not skip it)
    assert not book.applies("k2", "carol")  # not in the team
