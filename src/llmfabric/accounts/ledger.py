"""The usage ledger: per key, model and UTC day, prompt/completion tokens and request counts.

`record()` only adds to an in-memory aggregate (no I/O, safe on the request path); `flush()`
moves the aggregate into the database in one transaction of additive upserts, so several
processes can share one database and counts from all of them add up. A failed flush puts
its rows back, so nothing is lost short of a crash.

Usage is a claim by the provider: counts are clamped (accounts.policy.clamp_tokens) and a
row's running total never exceeds what a BIGINT column holds. If a batch fails but the
database answers, the rows are written one by one and a row that still fails is quarantined
(kept in `quarantined`, logged, not retried), so one bad row can never stop every later flush.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import heapq
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from llmfabric.accounts.db import Backend
from llmfabric.accounts.models import UsageRow
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST, clamp_tokens
from llmfabric.untrusted import get_logger

log = get_logger(__name__)
ROW_MAX = 2**62  # a pending row's counters saturate here (the column is a signed 64-bit int)
QUARANTINE_MAX = 1000
EXPORT_BATCH = 2000  # usage rows per query when a query is read in batches (`pages`)

_UPSERT = """INSERT INTO usage_daily
    (key_id, model, day, requests, prompt_tokens, completion_tokens, estimated_requests)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, day) DO UPDATE SET
    requests = usage_daily.requests + excluded.requests,
    prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens,
    estimated_requests = usage_daily.estimated_requests + excluded.estimated_requests"""


def utc_day(unix_s: float) -> str:
    """The UTC day of `unix_s` (floored: datetime's microsecond rounding would put a reading a
    hair before midnight on the next day, and disagree with the ledger's day span)."""
    return (_EPOCH + dt.timedelta(days=unix_s // 86400.0)).strftime("%Y-%m-%d")


_EPOCH = dt.date(1970, 1, 1)


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    prompt: int = 0
    completion: int = 0
    estimated: int = 0  # requests whose tokens the ingress counted (the engine reported none)


class UsageLedger:
    def __init__(self, backend: Backend, wall: Callable[[], float]) -> None:
        self._backend = backend
        self._wall = wall
        self._day = ""  # utc_day of the last record, valid while the wall clock is in
        self._day_span = (0.0, -1.0)  # [start, end) of that day
        self._pending: dict[tuple[str, str, str], _Counts] = {}
        self._writing: asyncio.Future[int] | None = None
        # Batches taken for writing and the newest one written, numbered from 1: usage
        # recorded now goes out in batch `batches_taken + 1` (or later, if that write fails
        # and its rows are put back), so it is in the database once `batches_written` reaches
        # that number (accounts.budgets keeps settled spending apart until then).
        self.batches_taken = 0
        self.batches_written = 0
        # Rows the database refused on their own (while it accepted others), newest last.
        self.quarantined: list[tuple[str, str, str, int, int, int, int]] = []
        self.quarantined_total = 0

    @property
    def pending_rows(self) -> int:
        return len(self._pending)

    def record(self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
               estimated: bool = False) -> None:
        now = self._wall()
        start, end = self._day_span
        row = (key_id, model, self._day if start <= now < end else self._today(now))
        c = self._pending.get(row)
        if c is None:
            c = self._pending[row] = _Counts()
        if not (type(prompt_tokens) is int and type(completion_tokens) is int
                and 0 <= prompt_tokens <= MAX_TOKENS_PER_REQUEST
                and 0 <= completion_tokens <= MAX_TOKENS_PER_REQUEST):  # (one test, usually)
            prompt_tokens, completion_tokens = (clamp_tokens(prompt_tokens),
                                                clamp_tokens(completion_tokens))
        # Saturating adds (each counter stops at ROW_MAX), spelled out: this runs per request.
        if (v := c.requests + 1) > ROW_MAX:
            v = ROW_MAX
        c.requests = v
        if estimated and (v := c.estimated + 1) <= ROW_MAX:
            c.estimated = v
        if (v := c.prompt + prompt_tokens) > ROW_MAX:
            v = ROW_MAX
        c.prompt = v
        if (v := c.completion + completion_tokens) > ROW_MAX:
            v = ROW_MAX
        c.completion = v

    def _today(self, now: float) -> str:
        """utc_day(now), formatted once per day (a strftime per request was measurable)."""
        start, end = self._day_span
        if not start <= now < end:
            start = now - now % 86400.0  # (UTC days are 86400 s: no leap seconds in POSIX)
            self._day = utc_day(start)
            self._day_span = (start, start + 86400.0)
        return self._day

    async def flush(self) -> int:
        """Write pending rows; returns how many (key, model, day) rows were written.

        One write at a time, and a write once started is never cancelled halfway: it runs in
        its own task under asyncio.shield, so a caller cancelled mid-flush (a shutdown, a
        dropped HTTP client) cannot leave a batch both committed and put back, which the next
        flush would count twice. A write that fails puts its rows back for the next flush."""
        while self._writing is not None and not self._writing.done():
            # Its failure put its rows back and was raised to the flush that started it (its
            # caller logs and counts it: store.py usage_flush); the retry below raises a
            # failure that persists even when that caller was cancelled meanwhile.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._writing)
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        self.batches_taken += 1
        self._writing = asyncio.ensure_future(self._write(batch, self.batches_taken))
        self._writing.add_done_callback(_retrieve)
        return await asyncio.shield(self._writing)

    @property
    def next_batch(self) -> int:
        """The number of the batch that will carry usage recorded now."""
        return self.batches_taken + 1

    async def _write(self, batch: dict[tuple[str, str, str], _Counts], number: int) -> int:
        # In key order, so concurrent flushes (other processes sharing a Postgres database)
        # lock the same rows in the same order and cannot deadlock.
        rows = [
            (k, m, d, c.requests, c.prompt, c.completion, c.estimated)
            for (k, m, d), c in sorted(batch.items())
        ]
        try:
            await self._backend.executemany(_UPSERT, rows)
        except Exception:
            if not await self._reachable():
                self._put_back(batch)
                raise
            written = await self._write_one_by_one(rows)  # (what fails now never will)
        except BaseException:
            self._put_back(batch)
            raise
        else:
            written = len(rows)
        self.batches_written = max(self.batches_written, number)
        return written

    def _put_back(self, batch: dict[tuple[str, str, str], _Counts]) -> None:
        for key, c in batch.items():  # added to anything newer
            cur = self._pending.setdefault(key, _Counts())
            cur.requests = min(ROW_MAX, cur.requests + c.requests)
            cur.prompt = min(ROW_MAX, cur.prompt + c.prompt)
            cur.completion = min(ROW_MAX, cur.completion + c.completion)
            cur.estimated = min(ROW_MAX, cur.estimated + c.estimated)

    async def _reachable(self) -> bool:
        try:
            await self._backend.fetchall("SELECT 1")
        except Exception as exc:  # whatever the driver raises: the database is not there
            log.warning("accounts: the usage database does not answer: %r", exc)
            return False
        return True

    async def _write_one_by_one(self, rows: list[tuple[str, str, str, int, int, int, int]]
                                ) -> int:
        """The batch failed while the database answers: some row is bad (e.g. its stored
        total would overflow). Write the rest; quarantine what fails on its own."""
        written = 0
        for i, row in enumerate(rows):
            try:
                await self._backend.executemany(_UPSERT, [row])
                written += 1
            except Exception as exc:
                if not await self._reachable():  # the database went away meanwhile
                    self._put_back({(r[0], r[1], r[2]): _Counts(r[3], r[4], r[5], r[6])
                                    for r in rows[i:]})
                    raise
                log.error("accounts: usage row %s refused by the database (%s); quarantined",
                          row[:3], type(exc).__name__)
                self.quarantined.append(row)
                self.quarantined_total += 1
                del self.quarantined[:-QUARANTINE_MAX]
        return written

    async def query(
        self, key_id: str | None = None, owner: str | None = None, since_day: str | None = None,
        until_day: str | None = None, model: str | None = None,
    ) -> list[UsageRow]:
        """Every row, by day, key and model (in memory: `pages` reads them in batches)."""
        return [r async for batch in self.pages(key_id, owner, since_day, until_day, model)
                for r in batch]

    async def pages(
        self, key_id: str | None = None, owner: str | None = None, since_day: str | None = None,
        until_day: str | None = None, model: str | None = None, batch: int | None = None,
    ) -> AsyncIterator[list[UsageRow]]:
        """The rows `query` returns, in its order (day, key, model), `batch` at a time. Each
        batch is read by queries of its own that start after the last row read (keyset
        paging), so memory stays at about one batch whatever the ledger holds, and the
        database connection is free between batches (a slow reader holds nothing).
        Rows flushed meanwhile show if they sort after the rows already read.

        Without a key or owner filter the ledger is walked on the index usage_daily_day;
        with one, each of the keys' rows on usage_daily_key (by day and model, so no query
        sorts an owner's whole usage for every batch), merged here by day and key."""
        batch = batch or EXPORT_BATCH
        where, params = _filter(None, owner, since_day, until_day, model)
        if key_id is None and owner is None:
            async for rows in self._keyset(where, params, _BY_DAY, batch):
                yield rows
            return
        if key_id is not None:
            keys = [key_id]
        else:  # (in the database's order of ids, as ORDER BY u.key_id puts them)
            keys = [str(r[0]) for r in await self._backend.fetchall(
                "SELECT id FROM api_keys WHERE owner = ? ORDER BY id", (owner,))]
        per_key = max(64, batch // max(1, len(keys)))  # (memory: about max(batch, 64 keys))
        streams = [self._keyset([*where, "u.key_id = ?"], [*params, k], _BY_KEY, per_key)
                   for k in keys]
        buffers: list[collections.deque[UsageRow]] = []
        heap: list[tuple[str, int]] = []  # (day of the stream's next row, stream = key rank)
        for i, stream in enumerate(streams):
            buffers.append(collections.deque(await anext(stream, [])))
            if buffers[i]:
                heap.append((buffers[i][0].day, i))
        heapq.heapify(heap)
        out: list[UsageRow] = []
        while heap:
            _, i = heap[0]
            buf = buffers[i]
            out.append(buf.popleft())
            if not buf:
                buf.extend(await anext(streams[i], []))
            if buf:
                heapq.heapreplace(heap, (buf[0].day, i))
            else:
                heapq.heappop(heap)
            if len(out) >= batch:
                yield out
                out = []
        if out:
            yield out

    async def _keyset(self, where: list[str], params: list[str],
                      order: tuple[str, ...], batch: int) -> AsyncIterator[list[UsageRow]]:
        """Rows matching `where`, ordered by the columns `order`, `batch` per query."""
        after: list[str] = []
        while True:
            conds, args = list(where), list(params)
            if after:
                conds.append(f"({', '.join(order)}) > ({', '.join('?' * len(order))})")
                args.extend(after)
            sql = (
                "SELECT u.key_id, COALESCE(k.owner, ''), u.model, u.day, u.requests, "
                "u.prompt_tokens, u.completion_tokens, u.estimated_requests FROM usage_daily u "
                "LEFT JOIN api_keys k ON k.id = u.key_id"
                + (" WHERE " + " AND ".join(conds) if conds else "")
                + f" ORDER BY {', '.join(order)} LIMIT {int(batch)}"
            )
            got = await self._backend.fetchall(sql, args)
            if got:
                yield [UsageRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]),
                                int(r[5]), int(r[6]), int(r[7])) for r in got]
            if len(got) < batch:
                return
            last = got[-1]
            after = [str(last[_COLUMN_AT[c]]) for c in order]

    async def totals(
        self, key_id: str | None = None, owner: str | None = None, since_day: str | None = None,
        until_day: str | None = None, model: str | None = None,
    ) -> tuple[int, int, int]:
        """(requests, prompt tokens, completion tokens) summed over the rows `query` returns,
        in one aggregate query (SQLite's SUM raises past 2**63: then summed here, a batch at
        a time)."""
        where, params = _filter(key_id, owner, since_day, until_day, model)
        sql = ("SELECT COALESCE(SUM(u.requests), 0), COALESCE(SUM(u.prompt_tokens), 0), "
               "COALESCE(SUM(u.completion_tokens), 0) FROM usage_daily u "
               "LEFT JOIN api_keys k ON k.id = u.key_id"
               + (" WHERE " + " AND ".join(where) if where else ""))
        try:
            [(requests, prompt, completion)] = await self._backend.fetchall(sql, params)
            return int(requests), int(prompt), int(completion)
        except Exception as exc:
            if "overflow" not in str(exc).lower():
                raise
        out = [0, 0, 0]
        async for rows in self.pages(key_id, owner, since_day, until_day, model):
            for r in rows:
                out[0] += r.requests
                out[1] += r.prompt_tokens
                out[2] += r.completion_tokens
        return out[0], out[1], out[2]


_BY_DAY = ("u.day", "u.key_id", "u.model")
_BY_KEY = ("u.day", "u.model")  # (one key's rows)
_COLUMN_AT = {"u.key_id": 0, "u.model": 2, "u.day": 3}  # in the SELECT of `_keyset`


def _filter(key_id: str | None, owner: str | None, since_day: str | None,
            until_day: str | None, model: str | None) -> tuple[list[str], list[str]]:
    """The WHERE conditions and parameters of a usage query (all in SQL: an export of one
    day must not read a year)."""
    where, params = [], []
    for cond, value in (("u.day <= ?", until_day), ("u.model = ?", model),
                        ("u.key_id = ?", key_id), ("k.owner = ?", owner),
                        ("u.day >= ?", since_day)):
        if value is not None:
            where.append(cond)
            params.append(value)
    return where, params


def _retrieve(fut: asyncio.Future[int]) -> None:
    """Mark a write's failure as seen: the caller that started it may have been cancelled
    (the rows are back in the ledger; the next flush retries them)."""
    if not fut.cancelled():
        fut.exception()
