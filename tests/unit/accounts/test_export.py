"""Usage export: filters, CSV (formula cells defused) and JSON with totals; the CLI."""

from __future__ import annotations

import csv
import io
import json
import pathlib

import orjson
import pytest
from click.testing import CliRunner

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.export import ExportFilter, render, to_csv
from llmfabric.accounts.models import UsageRow

pytestmark = pytest.mark.unit

ROWS = [
    UsageRow("k1", "alice", "m", "2026-01-01", 2, 10, 5),
    UsageRow("k1", "alice", "=HYPERLINK(\"x\")", "2026-01-02", 1, 3, 1, 1),
    UsageRow("k2", "bob", "m", "2026-01-03", 4, 40, 20),
]


def test_csv_defuses_formulas_and_keeps_every_column() -> None:
    rows = list(csv.DictReader(io.StringIO(to_csv(ROWS))))
    assert [r["model"] for r in rows] == ["m", "'=HYPERLINK(\"x\")", "m"]
    assert rows[2]["total_tokens"] == "60" and rows[1]["estimated_requests"] == "1"


def test_filters_and_json_totals() -> None:
    flt = ExportFilter(model="m", until="2026-01-02")
    kept = [r for r in ROWS if flt.keep(r)]
    assert kept == ROWS[:1]
    body, ctype = render(kept, flt, "json")
    doc = orjson.loads(body)
    assert ctype == "application/json" and doc["totals"] == {
        "requests": 2, "prompt_tokens": 10, "completion_tokens": 5}
    assert doc["filter"]["until"] == "2026-01-02"


@pytest.mark.parametrize("kw", [{"since": "2026-1-1"}, {"until": "x"},
                                {"since": "2026-01-02", "until": "2026-01-01"}])
def test_bad_ranges_are_refused(kw: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest):
        ExportFilter(**kw)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        render(ROWS, ExportFilter(), "xml")


def test_cli_exports_the_ledger(tmp_path: pathlib.Path) -> None:
    from llmfabric.cli.apikeys import create
    from llmfabric.cli.usage_export import usage_export

    runner = CliRunner()
    db = str(tmp_path / "a.db")
    out = runner.invoke(create, ["--name", "a", "--owner", "alice", "--json", "--db", db])
    assert out.exit_code == 0, out.output
    key_id = json.loads(out.output)["id"]
    import asyncio

    from llmfabric.accounts.store import AccountStore

    async def add() -> None:
        store = await AccountStore.open(db, background=False)
        store.record_usage(key_id, "m", 5, 6)
        await store.aclose()

    asyncio.run(add())
    got = runner.invoke(usage_export, ["--db", db, "--owner", "alice"])
    assert got.exit_code == 0, got.output
    [row] = list(csv.DictReader(io.StringIO(got.output)))
    assert row["key_id"] == key_id and row["total_tokens"] == "11"
    target = tmp_path / "u.json"
    got = runner.invoke(usage_export, ["--db", db, "--format", "json", "-o", str(target)])
    assert got.exit_code == 0 and json.loads(target.read_text())["totals"]["requests"] == 1
    bad = runner.invoke(usage_export, ["--db", db, "--since", "tomorrow"])
    assert bad.exit_code != 0 and "YYYY-MM-DD" in bad.output
