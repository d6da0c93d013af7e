"""Usage export: ledger rows filtered by key, owner, model and a UTC day range, as CSV or
JSON (the admin route GET /v1/fabric/usage/export and `llmfabric keys usage-export`).

CSV cells that a spreadsheet would run as a formula (a key name or model starting with
=, +, - or @) are prefixed with a quote: model names come from clients.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.models import UsageRow

FORMATS = ("csv", "json")
COLUMNS = ("day", "key_id", "owner", "model", "requests", "prompt_tokens",
           "completion_tokens", "total_tokens", "estimated_requests")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")
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
            if v is not None and not _DAY.match(v):
                raise InvalidRequest(f"{name} must be a UTC day YYYY-MM-DD")
        if self.since and self.until and self.until < self.since:
            raise InvalidRequest("until is before since")

    def keep(self, row: UsageRow) -> bool:
        return ((self.model is None or row.model == self.model)
                and (self.until is None or row.day <= self.until))


def _cell(v: object) -> object:
    if isinstance(v, str) and v.startswith(_FORMULA):
        return "'" + v
    return v


def to_csv(rows: Iterable[UsageRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        d = r.to_json()
        w.writerow([_cell(d[c]) for c in COLUMNS])
    return buf.getvalue()


def to_json(rows: Sequence[UsageRow], flt: ExportFilter) -> bytes:
    totals = {"requests": sum(r.requests for r in rows),
              "prompt_tokens": sum(r.prompt_tokens for r in rows),
              "completion_tokens": sum(r.completion_tokens for r in rows)}
    return orjson.dumps({"object": "usage_export", "filter": {
        "key_id": flt.key_id, "owner": flt.owner, "model": flt.model, "since": flt.since,
        "until": flt.until}, "totals": totals, "data": [r.to_json() for r in rows]})


def render(rows: Sequence[UsageRow], flt: ExportFilter, fmt: str) -> tuple[bytes, str]:
    """(body, content type) of the export in `fmt`."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"format must be one of {FORMATS}")
    if fmt == "csv":
        return to_csv(rows).encode(), "text/csv"
    return to_json(rows, flt), "application/json"
