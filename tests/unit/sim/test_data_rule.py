"""Reference-data rule R1 (benchmarks/_sim_datarule.py): vidur's decode-regime token scaling
must lie within aiconfigurator's cuBLAS band on the same GPU."""

from __future__ import annotations

import pytest

from llmfabric.testing.benchmark_module import load_benchmark
from llmfabric.testing.shared_data import require_data, shared_data

PROFILES = shared_data("operator-profiles")


R = load_benchmark("_sim_datarule")


def _gemm(m: int, n: int, k: int, ms: float) -> dict[str, object]:
    return {"gemm_dtype": "bfloat16", "m": m, "n": n, "k": k, "latency": ms}


def test_step_ratio_band_by_hand() -> None:
    # shapes a..e at m=1 and m=2: ratios 0.9, 1.0, 1.0, 1.0, 1.1 (and one fp8 row ignored)
    recs = [_gemm(2, n, 64, 1.0) for n in range(1, 6)]
    recs += [_gemm(1, 1, 64, 0.9), _gemm(1, 2, 64, 1.0), _gemm(1, 3, 64, 1.0),
             _gemm(1, 4, 64, 1.0), _gemm(1, 5, 64, 1.1),
             {"gemm_dtype": "fp8", "m": 1, "n": 1, "k": 64, "latency": 9.0}]
    lo, med, hi, n = R.gemm_step_ratios(recs)[(1, 2)]
    assert n == 5 and med == pytest.approx(1.0)
    assert lo == pytest.approx(0.92) and hi == pytest.approx(1.08)  # 5th/95th percentiles


def test_flag_and_replace_from_large_to_small_m() -> None:
    ratios = {(1, 2): (0.95, 1.0, 1.05, 10), (2, 4): (0.95, 0.98, 1.05, 10)}
    layer = {1: 40e-6, 2: 45e-6, 4: 50e-6, 128: 90e-6}
    flags = R.flags_for("G", "M", 8, layer, ratios)
    # 45/50 = 0.90 < 0.95: m=2 -> 50 x 0.98 = 49; then 40/49 = 0.816: m=1 -> 49 x 1.0
    assert [(f.m, f.m_next) for f in flags] == [(2, 4), (1, 2)]
    assert layer[2] == pytest.approx(49e-6) and layer[1] == pytest.approx(49e-6)
    assert flags[0].original_s == 45e-6 and flags[1].ratio == pytest.approx(40 / 49)
    # consistent points and pairs without aiconfigurator data are left alone
    same = {1: 50e-6, 2: 50e-6, 4: 50e-6}
    assert R.flags_for("G", "M", 8, same, ratios) == [] and same[1] == 50e-6


def test_shared_data_flags_one_point() -> None:
    require_data(PROFILES / "vidur" / "compute", PROFILES / "aiconfigurator")
    pq = pytest.importorskip("pyarrow.parquet")
    flags = R.corrections(PROFILES / "vidur/compute", {"a100": "A100-80GB", "h100": "H100-SXM",
                                                        "a40": "A40"},
                          PROFILES / "aiconfigurator",
                          {"A100-80GB": "a100_sxm", "H100-SXM": "h100_sxm"},
                          lambda p: pq.read_table(p).to_pylist())
    assert [(f.gpu, f.model, f.tp, f.m) for f in flags] == [("H100-SXM", "Llama-2-7b-hf", 8, 1)]
    assert flags[0].original_s == pytest.approx(41e-6)
    assert flags[0].replaced_s == pytest.approx(45e-6 * flags[0].median)
