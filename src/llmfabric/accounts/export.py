"""Usage export: ledger rows filtered by key, owner, model and a UTC day range, as CSV or
JSON (the admin route GET /v1/fabric/usage/export and `llmfabric keys usage-export`).

CSV cells that a spreadsheet would run as a formula (a key name or model starting with
=, +, - or @) are prefixed with a quote: model names come from clients.

`stream()` writes an export a batch of rows at a time as the database hands them out
(accounts.ledger `pages`), so memory stays at one batch whatever the ledger holds; its bytes
are those `render()` makes of the same rows (JSON's totals, which come before the rows, are
one aggregate query first).
"""

from __future__ import annotations

import csv
import datetime
import io
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.models import UsageRow

FORMATS = ("csv", "json")
COLUMNS = ("day", "key_id", "owner", "model", "requests", "prompt_tokens",
           "completion_tokens", "total_tokens", "estimated_requests")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")


def is_utc_day(text: str) -> bool:
    """YYYY-MM-DD naming a real day: '2024-13-01' matched the pattern and, compared as text,
    silently selected nothing."""
    if not _DAY.match(text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True, slots=True)
class ExportFilter:
    key_id: str | None = None
    owner: str | None = None
    model: str | None = None
    since: str | None = None  # first UTC day, inclusive
    until: str | None = None  # last UTC day, inclusive

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            v = getattr(self, name)
            if v is not None and not is_utc_day(v):
                raise InvalidRequest(f"{name} must be a UTC day YYYY-MM-DD, not {v!r}")
        if self.since and self.until and self.until < self.since:
            raise InvalidRequest("until is before since")

    def keep(self, row: UsageRow) -> bool:
        return ((self.model is None or row.model == self.model)
                and (self.until is None or row.day <= self.until))


def _cell(v: object) -> object:
    if isinstance(v, str) and v.startswith(_FORMULA):
        return "'" + v
    return v


def _csv_rows(rows: Iterable[UsageRow], header: bool = False) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(COLUMNS)
    for r in rows:
        d = r.to_json()
        w.writerow([_cell(d[c]) for c in COLUMNS])
    return buf.getvalue()


def to_csv(rows: Iterable[UsageRow]) -> str:
    return _csv_rows(rows, header=True)


def _json_head(flt: ExportFilter, requests: int, prompt: int, completion: int) -> bytes:
    """The JSON export up to its first row: `to_json` of no rows without its `[]}`."""
    totals = {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion}
    return orjson.dumps({"object": "usage_export", "filter": {
        "key_id": flt.key_id, "owner": flt.owner, "model": flt.model, "since": flt.since,
        "until": flt.until}, "totals": totals})[:-1] + b',"data":['


def to_json(rows: Sequence[UsageRow], flt: ExportFilter) -> bytes:
    head = _json_head(flt, sum(r.requests for r in rows), sum(r.prompt_tokens for r in rows),
                      sum(r.completion_tokens for r in rows))
    return head + b",".join(orjson.dumps(r.to_json()) for r in rows) + b"]}"


def content_type(fmt: str) -> str:
    """The content type of an export in `fmt`; InvalidRequest for an unknown format."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"format must be one of {FORMATS}")
    return "text/csv" if fmt == "csv" else "application/json"


def render(rows: Sequence[UsageRow], flt: ExportFilter, fmt: str) -> tuple[bytes, str]:
    """(body, content type) of the export in `fmt` (in memory; `stream` for the ledger)."""
    ctype = content_type(fmt)
    if fmt == "csv":
        return to_csv(rows).encode(), ctype
    return to_json(rows, flt), ctype


Pages = Callable[[ExportFilter], AsyncIterator[list[UsageRow]]]
Totals = Callable[[ExportFilter], Awaitable[tuple[int, int, int]]]


async def stream(pages: Pages, totals: Totals, flt: ExportFilter, fmt: str
                 ) -> AsyncGenerator[bytes, None]:
    """The export in `fmt` in pieces, a batch of rows each (AccountStore `usage_pages` and
    `usage_totals`): joined, the bytes `render` makes of the same rows. The first piece
    comes after the database answered (an error there raises before anything is sent)."""
    content_type(fmt)
    if fmt == "csv":
        head = _csv_rows((), header=True).encode()
        async for rows in pages(flt):
            yield head + _csv_rows(rows).encode()
            head = b""
        if head:
            yield head
        return
    yield _json_head(flt, *(await totals(flt)))
    sep = b""
    async for rows in pages(flt):
        yield sep + b",".join([orjson.dumps(r.to_json()) for r in rows])
        sep = b","
    yield b"]}"
