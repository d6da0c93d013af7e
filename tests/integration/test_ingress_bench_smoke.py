"""Smoke test of benchmarks/ingress_overhead.py: tiny phases, peers skipped, JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "ingress_overhead.py"
KEYS = {"added_p50_ms_c1", "added_p99_ms_c1", "added_p50_ms_c32", "max_rps", "stream_ttfb_ms",
        "stream_chunk_overhead_us", "cpu_percent"}


@pytest.mark.slow
def test_benchmark_runs_and_writes_the_documented_shape(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), "--duration", "0.3", "--rounds", "1",
         "--peers", "not-a-router", "--no-auth-variant", "--workers", "1"],
        check=True, timeout=240, capture_output=True,
    )
    doc = json.loads(out.read_text())
    assert set(doc["routers"]) == {"llmfabric"}
    assert set(doc["routers"]["llmfabric"]) >= KEYS
    assert doc["routers"]["llmfabric"]["max_rps"] > 0
    assert doc["routers"]["llmfabric"]["errors"] == 0
    assert doc["skipped"] == {"not-a-router": "unknown peer name"}
    assert "| llmfabric |" in out.with_suffix(".md").read_text()
