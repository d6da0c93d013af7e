"""`llmfabric simulate flying`: runs a burst trace, writes the Fig. 8 PNG, --max-context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.simulate import command
from llmfabric.sim.flying import max_context_tokens

pytestmark = pytest.mark.unit


def test_flying_burst_run_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    res = CliRunner().invoke(command, [
        "flying", "--model", "llama-3.1-8b", "--gpu", "H100", "--gpus", "4", "--base-tp", "1",
        "--widths", "1,2,4", "--arrival", "onoff", "--low", "1-2", "--high", "20-30",
        "--period", "20", "--burst", "5", "--duration", "40", "--input", "256",
        "--output", "32", "--priority-share", "0", "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.splitlines()[0])
    assert out["n_completed"] == out["n_requests"] > 0
    assert "NaN" not in res.output.splitlines()[0]  # strict JSON
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flying_max_context() -> None:
    res = CliRunner().invoke(command, [
        "flying", "--max-context", "--model", "llama-3.1-70b", "--gpu", "H200", "--gpus", "8",
        "--base-tp", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["static"] == max_context_tokens("llama-3.1-70b", "H200", 8, 4)
    assert out["flying"] == 2 * out["static"]


@pytest.mark.parametrize("bad", [["--widths", "1,3"], ["--low", "5-2"], ["--widths", "x"]])
def test_flying_bad_options_fail_cleanly(bad: list[str]) -> None:
    res = CliRunner().invoke(command, ["flying", "--model", "llama-3.1-8b", "--gpu", "H100",
                                       "--gpus", "2", "--base-tp", "1", "--duration", "5",
                                       *bad])
    assert res.exit_code != 0 and "Traceback" not in res.output
