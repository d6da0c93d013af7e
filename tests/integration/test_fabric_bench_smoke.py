"""Smoke test of benchmarks/fabric_overhead.py: tiny phases, real node processes, JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "fabric_overhead.py"
PATHS = {"direct", "fabric", "fabric-fast"}  # (no "provider": it needs a data-plane session)


@pytest.mark.slow
def test_fabric_benchmark_runs_and_writes_its_shape(tmp_path: Path) -> None:
    out = tmp_path / "fabric.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), "--duration", "0.3", "--rounds", "1",
         "--speed", "20"],
        check=True, timeout=240, capture_output=True,
    )
    doc = json.loads(out.read_text())
    assert set(doc["paths"]) == PATHS and set(doc["added"]) == PATHS - {"direct"}
    for phases in doc["paths"].values():
        assert set(phases) == {"stream_c1", "plain_c1", "stream_c16", "plain_c16"}
        for phase in phases.values():
            assert phase["n"] > 0 and phase["errors"] == 0, phases
    assert set(doc["added"]["fabric"]) >= {"ttft_p50_ms_c1", "p50_ms_c16", "p95_ms_c1"}
    assert 0 < doc["lookup"]["random_64"]["lookup_pick_us"] < 1000
    assert "| fabric |" in out.with_suffix(".md").read_text()
