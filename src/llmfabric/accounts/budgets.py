"""Budgets per key, per owner and per team (a named group of owners: each owner belongs to
at most one, so a key counts against its own, its owner's and its owner's team's budget),
per UTC day or month, in tokens or in spend (USD, from
the per-model prices in accounts/prices.py), enforced with reservations.

A request reserves its worst case (prompt estimate + max_tokens) before it is forwarded and
settles to what it really used when it ends. It is admitted only if what was spent plus
what in-flight requests hold plus its own reservation fits the budget, so N concurrent
requests can never together overspend a budget (the race that a check-then-record scheme
loses). A refusal carries the real wait: the seconds until the period's budget renews.

Pure state on an injected wall clock; `BudgetStore` persists budgets (table `budgets`) and
team memberships (table `owner_teams`), seeds this period's spending from the usage ledger at
start, and `sync()`s every few seconds: the budgets, teams and prices other processes set in
the same database, and what the ledger says was spent (every process that writes to it: the
workers of `llmfabric ingress --workers N`, ingresses sharing Postgres), plus what this
process settled that its ledger has not written yet.

Across ingresses (accounts/spend_share.py): the book keeps apart what THIS ingress spent
(`own`: settled here, plus its own ledger at start) so it can publish it, and adds what the
other ingresses published (`remote`, clamped to the budget's limit) when it admits.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmfabric.accounts.db import Backend, PostgresBackend
from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.ledger import UsageLedger
from llmfabric.accounts.prices import Price, price_of, validate_price
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

PERIODS = ("day", "month")
_PERIODIC = {"day": "daily", "month": "monthly"}  # (a refusal names its budget so)
SCOPES = ("key", "owner", "team")
UNITS = ("tokens", "usd")
MAX_BUDGET_TOKENS = 10**15  # also the cap in micro-USD (a billion dollars)
_MAX_UNWRITTEN = 256  # ledger batches whose settled spending is kept apart (BudgetBook)
_MAX_ADOPTED = 10_000  # budgets defined by other ingresses met here (the least recent go)


@dataclass(frozen=True, slots=True)
class Budget:
    scope: str  # "key", "owner" or "team"
    name: str  # the key id, the owner name or the team name
    limit: int  # allowed per period: tokens, or micro-USD for unit "usd"
    period: str  # "day" or "month" (UTC)
    unit: str = "tokens"

    def show(self, amount: int) -> str:
        return f"{amount} tokens" if self.unit == "tokens" else f"${amount / 1e6:.6g}"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"scope": self.scope, "name": self.name,
                                  "period": self.period, "unit": self.unit}
        if self.unit == "tokens":
            out["tokens"] = self.limit
        else:
            out["usd"] = self.limit / 1e6
        return out


def validate_budget(scope: str, name: str, tokens: int | None, period: str,
                    usd: float | None = None) -> Budget:
    """A budget of `tokens` or of `usd` (exactly one) per `period`."""
    if scope not in SCOPES:
        raise InvalidRequest(f"budget scope must be one of {SCOPES}, not {scope!r}")
    if period not in PERIODS:
        raise InvalidRequest(f"budget period must be one of {PERIODS}, not {period!r}")
    if not name or len(name) > 200:
        raise InvalidRequest("budget name must be 1..200 characters")
    if (tokens is None) == (usd is None):
        raise InvalidRequest("a budget is in tokens or in usd: give exactly one")
    if usd is not None:
        if isinstance(usd, bool) or not isinstance(usd, int | float) or not (
                0 < usd * 1e6 <= MAX_BUDGET_TOKENS):
            raise InvalidRequest("budget usd must be a positive amount (at most 1e9)")
        return Budget(scope, name, max(1, round(usd * 1e6)), period, "usd")
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
        b = self.budget
        what = "token budget" if b.unit == "tokens" else "spend budget"
        return (f"the {_PERIODIC[b.period]} {what} of {b.scope} {b.name!r} ({b.show(b.limit)}) is "
                f"used up ({b.show(self.spent)} spent or reserved); it renews in "
                f"{int(self.retry_after_s)} s")


@dataclass(slots=True)
class Hold:
    """One admitted request's reservation: (budget key, amount, unit) per budget it counts
    for. `issuer`: "" for a key of this database (the ledger can tell its owner, so its
    owner and team totals will hold what it spends), else the ingress that issued it."""

    parts: list[tuple[tuple[str, str, str], int, str]]
    settled: bool = False
    issuer: str = ""


class BudgetBook:
    def __init__(self, wall: Callable[[], float]) -> None:
        self.wall = wall
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.spent: dict[tuple[str, str, str], int] = {}  # (scope, name, period id) -> tokens
        self.held: dict[tuple[str, str, str], int] = {}
        self.prices: dict[str, Price] = {}  # model ("*": any other) -> price (spend budgets)
        self.teams: dict[str, str] = {}  # owner -> its team (owners without one: absent)
        # What this ingress itself spent (published to the others, spend_share.py) and what
        # the others published: (scope, name, period id) -> amount, or None (alone).
        self.own: dict[tuple[str, str, str], int] = {}
        self.remote: Callable[[tuple[str, str, str]], int] | None = None
        # With a ledger to follow (`BudgetStore.sync`): the number of the ledger batch that
        # carries usage recorded now, and what was settled here by that number, until the
        # batch is written and the ledger's totals hold it.
        self.ledger_batch: Callable[[], int] | None = None
        self._unwritten: dict[int, dict[tuple[str, str, str], int]] = {}
        # Owner and team spending of keys another ingress issued: the ledger has their usage
        # under their key id but no owner for them, so the book keeps it itself (it is lost
        # at a restart, as the seed from the ledger cannot find it either).
        self._unattributed: dict[tuple[str, str, str], int] = {}
        # The budgets the issuer of a key another ingress issued defined for that key and
        # its owner (accounts/spend_share.py `budget_for(scope, name, issuer)`), applied
        # where this ingress has none of its own; those met so far, by (scope, name,
        # issuer) (their spending is published like our own budgets').
        self.adopt: Callable[[str, str, str], Budget | None] | None = None
        self.adopted: dict[tuple[str, str, str], Budget] = {}

    def others(self, k: tuple[str, str, str], limit: int) -> int:
        """The other ingresses' published spending on budget key `k`, clamped to the
        budget's limit (a hostile ingress can exhaust a budget, never grow one)."""
        if self.remote is None:
            return 0
        return min(max(0, self.remote(k)), limit)

    def set(self, budget: Budget) -> None:
        self.budgets[(budget.scope, budget.name)] = budget

    def remove(self, scope: str, name: str) -> bool:
        return self.budgets.pop((scope, name), None) is not None

    def applies(self, key_id: str, owner: str, issuer: str = "") -> bool:
        """Whether any budget counts for this key, its owner or the owner's team (checked
        per request: the ingress keeps no budget state for a request when none does);
        `issuer`: the ingress that issued the key ("" for ours), whose budgets for it and
        its owner apply too."""
        b = self.budgets
        if b:
            if ("key", key_id) in b or ("owner", owner) in b:
                return True
            team = self.teams.get(owner)
            if team is not None and ("team", team) in b:
                return True
        adopt = self.adopt
        return bool(issuer) and adopt is not None and (
            adopt("key", key_id, issuer) is not None
            or adopt("owner", owner, issuer) is not None)

    def _applicable(self, key_id: str, owner: str, issuer: str = "") -> list[Budget]:
        out = []
        team = self.teams.get(owner)
        for scope, name in (("key", key_id), ("owner", owner), ("team", team)):
            if name is None:
                continue
            b = self.budgets.get((scope, name))
            if b is None and issuer and self.adopt is not None and scope != "team":
                b = self.adopt(scope, name, issuer)
                if b is not None:
                    k = (scope, name, issuer)
                    self.adopted.pop(k, None)  # (most recently met last)
                    self.adopted[k] = b
                    if len(self.adopted) > _MAX_ADOPTED:
                        del self.adopted[next(iter(self.adopted))]
            if b is not None:
                out.append(b)
        return out

    def reserve(self, key_id: str, owner: str, estimate: int, cost_micros: int = 0,
                issuer: str = "") -> Hold | OverBudget:
        """Reserve `estimate` tokens (or `cost_micros` on spend budgets) on every budget of
        the key, its owner and the owner's team, or refuse. `issuer`: the ingress that
        issued the key ("" for ours; `applies`)."""
        budgets = self._applicable(key_id, owner, issuer)
        if not budgets:
            return Hold([], issuer=issuer)
        now = self.wall()
        parts: list[tuple[tuple[str, str, str], int, str]] = []
        for b in budgets:
            pid, renews = period_of(b.period, now)
            k = (b.scope, b.name, pid)
            used = self.spent.get(k, 0) + self.held.get(k, 0) + self.others(k, b.limit)
            # A request larger than the whole budget may still run alone at a period's start.
            need = min(max(0, estimate if b.unit == "tokens" else cost_micros), b.limit)
            if used + need > b.limit or used >= b.limit:
                return OverBudget(b, used, max(1.0, renews - now))
            parts.append((k, need, b.unit))
        for k, n, _ in parts:
            self.held[k] = self.held.get(k, 0) + n
        return Hold(parts, issuer=issuer)

    def settle(self, hold: Hold, used_tokens: int, used_micros: int = 0) -> None:
        """The request ended having used `used_tokens` costing `used_micros` (0 if it
        failed): release the hold, charge what was used. Idempotent."""
        if hold.settled:
            return
        hold.settled = True
        for k, n, unit in hold.parts:
            left = self.held.get(k, 0) - n
            if left > 0:
                self.held[k] = left
            else:
                self.held.pop(k, None)
            used = max(0, used_tokens if unit == "tokens" else used_micros)
            self.spent[k] = self.spent.get(k, 0) + used
            self.own[k] = self.own.get(k, 0) + used
            if self.ledger_batch is None or not used:
                continue
            # Where the next sync finds this spending: the ledger cannot tell the owner of a
            # key another ingress issued, so its owner and team spending stays here; a
            # budget of ours reads the ledger (until it is written: the journal); an
            # adopted key budget has no ledger totals, and a sync keeps its spent as is.
            if k[0] != "key" and hold.issuer:
                self._unattributed[k] = self._unattributed.get(k, 0) + used
            elif k[:2] in self.budgets:
                journal = self._unwritten.setdefault(self.ledger_batch(), {})
                journal[k] = journal.get(k, 0) + used
        if len(self._unwritten) > _MAX_UNWRITTEN:  # (a database down for long: merge the
            oldest = min(self._unwritten)         # oldest into the next; it counts longer)
            merged = self._unwritten.pop(oldest)
            nxt = self._unwritten.setdefault(min(self._unwritten), {})
            for k, n in merged.items():
                nxt[k] = nxt.get(k, 0) + n

    def adopt_ledger(self, totals: dict[tuple[str, str, str], int], written: int) -> None:
        """The ledger's totals for the current period of every budget of ours (what every
        process writing to it spent), read after ledger batch `written` was written: their
        spent becomes those totals plus what was settled here and is not in them yet
        (written later; and the owner and team spending of keys other ingresses issued,
        which the ledger cannot attribute). The spent of other budgets (adopted ones: only
        what was settled here) is kept for the current periods. Reservations held here stay
        as they are. Adopted budgets whose definition is gone are forgotten."""
        for batch in [b for b in self._unwritten if b <= written]:
            del self._unwritten[batch]
        now = self.wall()
        current = {period_of("day", now)[0], period_of("month", now)[0]}
        spent = {k: max(0, n) for k, n in totals.items()}
        for journal in self._unwritten.values():
            for k, n in journal.items():
                if k in spent:
                    spent[k] += n
        # Adopted key budgets keep what was settled here (adopted owner budgets are spent
        # on by foreign keys only: their spending is in `_unattributed`, added below).
        for k, n in self.spent.items():
            if k[0] == "key" and k[:2] not in self.budgets and k[2] in current:
                spent[k] = n
        self._unattributed = {k: n for k, n in self._unattributed.items() if k[2] in current}
        for k, n in self._unattributed.items():
            spent[k] = spent.get(k, 0) + n
        self.spent = spent
        self.own = {k: n for k, n in self.own.items() if k[2] in current}
        adopt = self.adopt
        self.adopted = {k: b for k, b in self.adopted.items()
                        if adopt is not None and adopt(*k) == b}

    def charge(self, scope: str, name: str, period_id: str, amount: int,
               own: bool = False) -> None:
        """Spending recorded elsewhere (the ledger at start), in the budget's unit; `own`:
        spent at this ingress (its private ledger), so it is published too."""
        k = (scope, name, period_id)
        self.spent[k] = self.spent.get(k, 0) + max(0, amount)
        if own:
            self.own[k] = self.own.get(k, 0) + max(0, amount)

    def own_now(self) -> dict[tuple[str, str, str], int]:
        """This ingress's spending in the current periods, on every budget it counted
        against this period: also one whose definition changed or went since (an issuer
        raising a limit, or restarting), which others still count it against."""
        now = self.wall()
        current = {period_of("day", now)[0], period_of("month", now)[0]}
        return {k: n for k, n in self.own.items() if n > 0 and k[2] in current}

    def cost_micros(self, model: str, prompt_tokens: int, completion_tokens: int) -> int:
        price = price_of(self.prices, model)
        return price.micros(prompt_tokens, completion_tokens) if price is not None else 0

    def amount(self, unit: str, model: str, prompt_tokens: int, completion_tokens: int) -> int:
        """Tokens, or their cost in micro-USD, for a budget of `unit`."""
        if unit == "tokens":
            return max(0, prompt_tokens) + max(0, completion_tokens)
        return self.cost_micros(model, prompt_tokens, completion_tokens)

    def status_for(self, key_id: str, owner: str, issuer: str = "") -> list[dict[str, object]]:
        """`status()` of the budgets a request of this key would count against (its key's,
        its owner's and its team's, those its issuer defined included)."""
        mine = {(b.scope, b.name) for b in self._applicable(key_id, owner, issuer)}
        return [r for r in self.status() if (r["scope"], r["name"]) in mine]

    def status(self) -> list[dict[str, object]]:
        now = self.wall()
        out: list[dict[str, object]] = []
        adopted = list({(b.scope, b.name): b for k, b in self.adopted.items()
                        if k[:2] not in self.budgets}.values())
        for b in sorted((*self.budgets.values(), *adopted), key=lambda b: (b.scope, b.name)):
            pid, renews = period_of(b.period, now)
            k = (b.scope, b.name, pid)
            out.append({**b.to_json(), "period_id": pid, "spent": self.spent.get(k, 0),
                        "held": self.held.get(k, 0), "elsewhere": self.others(k, b.limit),
                        "renews_at": renews, "issuer_defined": (b.scope, b.name)
                        not in self.budgets})
        return out


def validate_team(owner: str, team: str) -> tuple[str, str]:
    """An owner's team membership: both names 1..200 characters."""
    for what, name in (("owner", owner), ("team", team)):
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidRequest(f"{what} name must be 1..200 characters")
    return owner, team


_TABLES = (
    """CREATE TABLE IF NOT EXISTS owner_teams (
    owner TEXT PRIMARY KEY, team TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS budgets (
    scope TEXT NOT NULL, name TEXT NOT NULL, amount BIGINT NOT NULL, period TEXT NOT NULL,
    unit TEXT NOT NULL, PRIMARY KEY (scope, name))""",
    """CREATE TABLE IF NOT EXISTS model_prices (
    model TEXT PRIMARY KEY, prompt_usd_per_mtok DOUBLE PRECISION NOT NULL,
    completion_usd_per_mtok DOUBLE PRECISION NOT NULL)""",
)
_UPSERT = """INSERT INTO budgets (scope, name, amount, period, unit) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (scope, name) DO UPDATE SET amount = excluded.amount, period = excluded.period,
    unit = excluded.unit"""
_UPSERT_TEAM = """INSERT INTO owner_teams (owner, team) VALUES (?, ?)
ON CONFLICT (owner) DO UPDATE SET team = excluded.team"""
# What the ledger spent per budget name of each scope in one period (`?`: the period's
# LIKE pattern, then the names): each query takes many budgets at once.
_SPENT_BY = {
    "key": "SELECT u.key_id, u.model, SUM(u.prompt_tokens), SUM(u.completion_tokens) "
           "FROM usage_daily u WHERE u.day LIKE ? AND u.key_id IN ({}) "
           "GROUP BY u.key_id, u.model",
    "owner": "SELECT k.owner, u.model, SUM(u.prompt_tokens), SUM(u.completion_tokens) "
             "FROM usage_daily u JOIN api_keys k ON k.id = u.key_id "
             "WHERE u.day LIKE ? AND k.owner IN ({}) GROUP BY k.owner, u.model",
    "team": "SELECT t.team, u.model, SUM(u.prompt_tokens), SUM(u.completion_tokens) "
            "FROM usage_daily u JOIN api_keys k ON k.id = u.key_id "
            "JOIN owner_teams t ON t.owner = k.owner "
            "WHERE u.day LIKE ? AND t.team IN ({}) GROUP BY t.team, u.model",
}
_NAMES_PER_QUERY = 400  # (SQLite binds at most 999 parameters in older builds)
_UPSERT_PRICE = """INSERT INTO model_prices (model, prompt_usd_per_mtok,
    completion_usd_per_mtok) VALUES (?, ?, ?)
ON CONFLICT (model) DO UPDATE SET prompt_usd_per_mtok = excluded.prompt_usd_per_mtok,
    completion_usd_per_mtok = excluded.completion_usd_per_mtok"""


def _budget_row(row: tuple[object, ...]) -> Budget | None:
    """A `budgets` row as a Budget, or None when no version of this code could have written
    it (the table is shared with other processes and programs; one bad row must not stop
    every other budget from loading or syncing)."""
    scope, name, amount, period, unit = row
    if (scope not in SCOPES or period not in PERIODS or unit not in UNITS
            or not isinstance(name, str) or not 0 < len(name) <= 200
            or isinstance(amount, bool) or not isinstance(amount, int)
            or not 0 < amount <= MAX_BUDGET_TOKENS):
        return None
    return Budget(str(scope), name, amount, str(period), str(unit))


class BudgetStore:
    """Budgets and model prices in the accounts database, mirrored in a `BudgetBook`.

    With `ledger` (this process's usage ledger), `sync()` keeps the book in step with the
    database that other processes share (`run_sync` calls it every `interval_s`; the
    ingress: tenancy/attach.py `BUDGET_SYNC_S`; one ledger query per scope and period)."""

    def __init__(self, backend: Backend, book: BudgetBook,
                 ledger: UsageLedger | None = None) -> None:
        self._db = backend
        self.book = book
        self._ledger = ledger
        if ledger is not None:
            book.ledger_batch = lambda: ledger.next_batch
        self._changes = 0  # puts and deletes made here (a sync must not undo one it raced)
        self.syncs = 0
        self.synced_at: float | None = None  # book.wall() of the last load or sync done
        self._bad_rows: set[tuple[str, tuple[object, ...]]] = set()  # ignored rows (warned)

    @property
    def shared_ledger(self) -> bool:
        """Whether the ledger is shared by every ingress (Postgres), not private (SQLite)."""
        return isinstance(self._db, PostgresBackend)

    async def load(self) -> None:
        """Create the tables, read budgets and prices, and seed this period's spending from
        the usage ledger (so a restarted ingress does not hand out a fresh budget)."""
        for table in _TABLES:
            await self._db.execute(table)
        budgets, teams, prices = await self._definitions()
        self.book.budgets, self.book.teams, self.book.prices = budgets, teams, prices
        # A private (SQLite) ledger holds only what this ingress spent: it is ours to
        # publish; a shared (Postgres) one already holds every ingress's spending.
        own = not isinstance(self._db, PostgresBackend)
        for (scope, name, pid), amount in (await self._ledger_totals()).items():
            self.book.charge(scope, name, pid, amount, own=own)
        self.synced_at = self.book.wall()

    async def sync(self) -> None:
        """Read again what other processes may have changed in the database: the budgets,
        teams and prices (unless this process changed one meanwhile: the next sync reads
        it), and this period's spending from the ledger, to which the book adds what was
        settled here and is not written yet (BudgetBook.adopt_ledger)."""
        if self._ledger is None:
            raise RuntimeError("BudgetStore.sync needs the usage ledger it follows")
        changes = self._changes
        # Read before the totals: a batch written meanwhile is then counted twice until the
        # next sync (an overstatement), never not at all.
        written = self._ledger.batches_written
        budgets, teams, prices = await self._definitions()
        if changes == self._changes:
            self.book.budgets, self.book.teams, self.book.prices = budgets, teams, prices
        self.book.adopt_ledger(await self._ledger_totals(), written)
        self.syncs += 1
        self.synced_at = self.book.wall()

    def sync_age_s(self) -> float:
        """Seconds since the book was last in step with the database (a gauge: a growing
        age means the database is out of reach and other processes' changes go unseen)."""
        return 0.0 if self.synced_at is None else max(0.0, self.book.wall() - self.synced_at)

    async def run_sync(self, sleep: Callable[[float], Awaitable[None]],
                       interval_s: float = 2.0,
                       failures: Counter[str] | None = None) -> None:
        """`sync()` every `interval_s` until cancelled; a failed one is logged, counted in
        `failures["budget_sync"]` and retried at the next tick (the book keeps what it had)."""
        while True:
            await sleep(interval_s)
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                if failures is not None:
                    failures["budget_sync"] += 1
                log.exception("budgets: sync with the accounts database failed; will retry")

    async def _definitions(self) -> tuple[dict[tuple[str, str], Budget], dict[str, str],
                                          dict[str, Price]]:
        prices: dict[str, Price] = {}
        for row in await self._db.fetchall(
                "SELECT model, prompt_usd_per_mtok, completion_usd_per_mtok FROM model_prices"):
            try:
                prices[str(row[0])] = validate_price(str(row[0]), row[1], row[2])
            except InvalidRequest:
                self._ignore("model_prices", row)
        teams: dict[str, str] = {}
        for row in await self._db.fetchall("SELECT owner, team FROM owner_teams"):
            try:
                owner, team = validate_team(*row)
            except (InvalidRequest, TypeError):
                self._ignore("owner_teams", row)
                continue
            teams[owner] = team
        budgets = {}
        for row in await self._db.fetchall(
                "SELECT scope, name, amount, period, unit FROM budgets"):
            b = _budget_row(row)
            if b is None:
                self._ignore("budgets", row)
                continue
            budgets[(b.scope, b.name)] = b
        return budgets, teams, prices

    def _ignore(self, table: str, row: tuple[object, ...]) -> None:
        """A row no version of llmfabric writes (another program?): skipped, warned once
        (a sync runs every 2 s), so one bad row does not stop the others loading."""
        if (table, row) not in self._bad_rows and len(self._bad_rows) < 1000:
            self._bad_rows.add((table, row))
            log.warning("budgets: ignoring a row of %s that is not valid: %r", table, row)

    async def _ledger_totals(self) -> dict[tuple[str, str, str], int]:
        """What the ledger holds for each budget's current period, in its unit (team
        budgets: the team's members as the `owner_teams` table has them now). One query
        per scope and period for up to `_NAMES_PER_QUERY` budgets."""
        now = self.book.wall()
        groups: dict[tuple[str, str], list[Budget]] = {}
        for b in self.book.budgets.values():
            if b.scope in _SPENT_BY:  # (else a row no version of this code wrote)
                groups.setdefault((b.scope, period_of(b.period, now)[0]), []).append(b)
        out: dict[tuple[str, str, str], int] = {}
        for (scope, pid), budgets in groups.items():
            for i in range(0, len(budgets), _NAMES_PER_QUERY):
                chunk = {b.name: b for b in budgets[i:i + _NAMES_PER_QUERY]}
                for b in chunk.values():
                    out[(scope, b.name, pid)] = 0
                sql = _SPENT_BY[scope].format(", ".join("?" * len(chunk)))
                for name, model, prompt, completion in await self._db.fetchall(
                        sql, (pid + "%", *chunk)):
                    b = chunk[str(name)]
                    out[(scope, b.name, pid)] += self.book.amount(
                        b.unit, str(model), int(prompt or 0), int(completion or 0))
        return out

    async def put(self, budget: Budget) -> None:
        self._changes += 1
        await self._db.execute(_UPSERT, (budget.scope, budget.name, budget.limit,
                                         budget.period, budget.unit))
        self.book.set(budget)

    async def delete(self, scope: str, name: str) -> bool:
        """Remove the budget; False if neither the database nor the book had it (another
        process may have set it since this one's last sync)."""
        self._changes += 1
        rows = await self._db.fetchall("SELECT 1 FROM budgets WHERE scope = ? AND name = ?",
                                       (scope, name))
        await self._db.execute("DELETE FROM budgets WHERE scope = ? AND name = ?",
                               (scope, name))
        return self.book.remove(scope, name) or bool(rows)

    async def put_team(self, owner: str, team: str) -> None:
        """Put `owner` in `team` (moving it out of any other). What the owner spent this
        period counts for its new team from the next sync on (the ledger has no team column:
        the team's total is read by member)."""
        self._changes += 1
        await self._db.execute(_UPSERT_TEAM, validate_team(owner, team))
        self.book.teams[owner] = team

    async def delete_team(self, owner: str) -> bool:
        self._changes += 1
        await self._db.execute("DELETE FROM owner_teams WHERE owner = ?", (owner,))
        return self.book.teams.pop(owner, None) is not None

    async def put_price(self, model: str, price: Price) -> None:
        self._changes += 1
        await self._db.execute(_UPSERT_PRICE, (model, price.prompt_usd_per_mtok,
                                               price.completion_usd_per_mtok))
        self.book.prices[model] = price

    async def delete_price(self, model: str) -> bool:
        self._changes += 1
        await self._db.execute("DELETE FROM model_prices WHERE model = ?", (model,))
        return self.book.prices.pop(model, None) is not None
