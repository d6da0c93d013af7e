"""`llmfabric trace analyze FILE --out DIR` end to end through click."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from llmfabric.cli.main import cli


def test_trace_analyze_command(native_trace: Callable[[str], Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = CliRunner().invoke(
        cli,
        [
            "trace",
            "analyze",
            str(native_trace("csv")),
            "--out",
            str(out),
            "--quiet",
            "--bin",
            "60",
            "--no-plots",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "6 requests, 2 models" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["a"]["prefix_reuse_ratio"] == 0.5
    assert json.loads((out / "trace.json").read_text())["bin_s"] == 60.0
    assert (out / "report.md").exists() and not (out / "lengths.png").exists()


def test_trace_analyze_reports_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"foo": 1}\n')
    result = CliRunner().invoke(cli, ["trace", "analyze", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert "pass the format" in result.output


def test_trace_analyze_header_only_and_bad_rows(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("timestamp,model,input_tokens,output_tokens\n")
    out = tmp_path / "o"
    result = CliRunner().invoke(
        cli, ["trace", "analyze", str(empty), "--out", str(out), "--quiet", "--no-plots"]
    )
    assert result.exit_code == 0, result.output
    assert "0 requests" in result.output
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,model,input_tokens,output_tokens\n1,m,-90,5\n")
    result = CliRunner().invoke(
        cli, ["trace", "analyze", str(bad), "--out", str(out), "--quiet", "--no-plots"]
    )
    assert result.exit_code == 1 and result.exception is not None
    assert isinstance(result.exception, SystemExit)
    assert "row 1: input tokens '-90' must be >= 0" in result.output
