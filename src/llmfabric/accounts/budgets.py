"""Token budgets per key and per owner, per UTC day or month, enforced with reservations.

A request reserves its worst case (prompt estimate + max_tokens) before it is forwarded and
settles to what it really used when it ends. It is admitted only if what was spent plus
what in-flight requests hold plus its own reservation fits the budget, so N concurrent
requests can never together overspend a budget (the race that a check-then-record scheme
loses). A refusal carries the real wait: the seconds until the period's budget renews.

Pure state on an injected wall clock; `BudgetStore` persists budgets (table `budgets`) and
seeds this period's spending from the usage ledger at start.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from llmfabric.accounts.db import Backend
from llmfabric.accounts.errors import InvalidRequest

PERIODS = ("day", "month")
SCOPES = ("key", "owner")
MAX_BUDGET_TOKENS = 10**15


@dataclass(frozen=True, slots=True)
class Budget:
    scope: str  # "key" or "owner"
    name: str  # the key id or the owner name
    tokens: int  # allowed per period
    period: str  # "day" or "month" (UTC)

    def to_json(self) -> dict[str, object]:
        return {"scope": self.scope, "name": self.name, "tokens": self.tokens,
                "period": self.period}


def validate_budget(scope: str, name: str, tokens: int, period: str) -> Budget:
    if scope not in SCOPES:
        raise InvalidRequest(f"budget scope must be one of {SCOPES}, not {scope!r}")
    if period not in PERIODS:
        raise InvalidRequest(f"budget period must be one of {PERIODS}, not {period!r}")
    if not name or len(name) > 200:
        raise InvalidRequest("budget name must be 1..200 characters")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not (
            0 < tokens <= MAX_BUDGET_TOKENS):
        raise InvalidRequest(f"budget tokens must be an integer in 1..{MAX_BUDGET_TOKENS}")
    return Budget(scope, name, tokens, period)


def period_of(period: str, unix_s: float) -> tuple[str, float]:
    """(period id, unix seconds when the next period starts) for a UTC day or month."""
    t = dt.datetime.fromtimestamp(unix_s, tz=dt.UTC)
    if period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return t.strftime("%Y-%m-%d"), (start + dt.timedelta(days=1)).timestamp()
    start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(
        month=start.month + 1)
    return t.strftime("%Y-%m"), nxt.timestamp()


@dataclass(frozen=True, slots=True)
class OverBudget:
    budget: Budget
    spent: int  # settled + held when refused
    retry_after_s: float  # until the period renews

    def message(self) -> str:
        return (f"the {self.budget.period}ly token budget of {self.budget.scope} "
                f"{self.budget.name!r} ({self.budget.tokens} tokens) is used up "
                f"({self.spent} spent or reserved); it renews in {int(self.retry_after_s)} s")


@dataclass(slots=True)
class Hold:
    """One admitted request's reservation: (budget key, tokens) per budget it counts for."""

    parts: list[tuple[tuple[str, str, str], int]]
    settled: bool = False


class BudgetBook:
    def __init__(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.spent: dict[tuple[str, str, str], int] = {}  # (scope, name, period id) -> tokens
        self.held: dict[tuple[str, str, str], int] = {}

    def set(self, budget: Budget) -> None:
        self.budgets[(budget.scope, budget.name)] = budget

    def remove(self, scope: str, name: str) -> bool:
        return self.budgets.pop((scope, name), None) is not None

    def _applicable(self, key_id: str, owner: str) -> list[Budget]:
        out = []
        for scope, name in (("key", key_id), ("owner", owner)):
            b = self.budgets.get((scope, name))
            if b is not None:
                out.append(b)
        return out

    def reserve(self, key_id: str, owner: str, estimate: int) -> Hold | OverBudget:
        """Reserve `estimate` tokens on every budget of the key and its owner, or refuse."""
        budgets = self._applicable(key_id, owner)
        if not budgets:
            return Hold([])
        now = self.wall()
        estimate = max(0, estimate)
        parts: list[tuple[tuple[str, str, str], int]] = []
        for b in budgets:
            pid, renews = period_of(b.period, now)
            k = (b.scope, b.name, pid)
            used = self.spent.get(k, 0) + self.held.get(k, 0)
            # A request larger than the whole budget may still run alone at a period's start.
            need = min(estimate, b.tokens)
            if used + need > b.tokens or used >= b.tokens:
                return OverBudget(b, used, max(1.0, renews - now))
            parts.append((k, need))
        for k, n in parts:
            self.held[k] = self.held.get(k, 0) + n
        return Hold(parts)

    def settle(self, hold: Hold, used_tokens: int) -> None:
        """The request ended having used `used_tokens` (0 if it failed): release the hold,
        charge what was used. Idempotent."""
        if hold.settled:
            return
        hold.settled = True
        for k, n in hold.parts:
            left = self.held.get(k, 0) - n
            if left > 0:
                self.held[k] = left
            else:
                self.held.pop(k, None)
            self.spent[k] = self.spent.get(k, 0) + max(0, used_tokens)

    def charge(self, scope: str, name: str, period_id: str, tokens: int) -> None:
        """Spending recorded elsewhere (the ledger at start, other ingresses)."""
        k = (scope, name, period_id)
        self.spent[k] = self.spent.get(k, 0) + max(0, tokens)

    def status(self) -> list[dict[str, object]]:
        now = self.wall()
        out: list[dict[str, object]] = []
        for b in sorted(self.budgets.values(), key=lambda b: (b.scope, b.name)):
            pid, renews = period_of(b.period, now)
            k = (b.scope, b.name, pid)
            out.append({**b.to_json(), "period_id": pid, "spent": self.spent.get(k, 0),
                        "held": self.held.get(k, 0), "renews_at": renews})
        return out


_TABLE = """CREATE TABLE IF NOT EXISTS budgets (
    scope TEXT NOT NULL, name TEXT NOT NULL, tokens BIGINT NOT NULL, period TEXT NOT NULL,
    PRIMARY KEY (scope, name))"""
_UPSERT = """INSERT INTO budgets (scope, name, tokens, period) VALUES (?, ?, ?, ?)
ON CONFLICT (scope, name) DO UPDATE SET tokens = excluded.tokens, period = excluded.period"""


class BudgetStore:
    """Budgets in the accounts database, mirrored in a `BudgetBook`."""

    def __init__(self, backend: Backend, book: BudgetBook) -> None:
        self._db = backend
        self.book = book

    async def load(self) -> None:
        """Create the table, read the budgets, and seed this period's spending from the
        usage ledger (so a restarted ingress does not hand out a fresh budget)."""
        await self._db.execute(_TABLE)
        for scope, name, tokens, period in await self._db.fetchall(
                "SELECT scope, name, tokens, period FROM budgets"):
            self.book.set(Budget(str(scope), str(name), int(tokens), str(period)))
        now = self.book.wall()
        for b in list(self.book.budgets.values()):
            pid, _ = period_of(b.period, now)
            col = "u.key_id" if b.scope == "key" else "k.owner"
            rows = await self._db.fetchall(
                "SELECT COALESCE(SUM(u.prompt_tokens + u.completion_tokens), 0) "
                "FROM usage_daily u LEFT JOIN api_keys k ON k.id = u.key_id "
                f"WHERE {col} = ? AND u.day LIKE ?", (b.name, pid + "%"))
            self.book.charge(b.scope, b.name, pid, int(rows[0][0]) if rows else 0)

    async def put(self, budget: Budget) -> None:
        await self._db.execute(_UPSERT, (budget.scope, budget.name, budget.tokens,
                                         budget.period))
        self.book.set(budget)

    async def delete(self, scope: str, name: str) -> bool:
        await self._db.execute("DELETE FROM budgets WHERE scope = ? AND name = ?",
                               (scope, name))
        return self.book.remove(scope, name)
