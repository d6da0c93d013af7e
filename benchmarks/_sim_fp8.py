"""FP8 GEMM efficiency: aiconfigurator's H100 FP8 GEMMs (CUTLASS scaled-mm, vLLM) against the
cost model, to fit `Efficiency.low_precision_compute` (the share of the BF16-fitted `compute`
factor that FP8 GEMMs reach at their doubled peak) and `Efficiency.low_precision_shaped` (the
shape-aware model used for the layers' GEMMs: m padded to 128-row tiles, share
compute x k/(k+k0) x m/(m+m0) x n/(n+n0); calibration.ShapedLowPrecision).

    .venv/bin/python benchmarks/_sim_fp8.py [--fit] [--fit-shaped]

Rows: every FP8 GEMM with n, k >= 1024 (the projection shapes of served models); split in
two by a stable hash of (m, n, k); the factor is fitted on the FIT half (grid 0.40-1.00) and
MAPE is reported on both halves. Read at run time from the shared data directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from llmfabric.sim import efficiency_for, get_gpu
from llmfabric.sim.calibration import ShapedLowPrecision
from llmfabric.sim.costs import _linear_times, op_time
from llmfabric.sim.operators import LinearOp, OpCost

HERE = Path(__file__).resolve().parent


def shared_data() -> Path:
    env = os.environ.get("LLMFABRIC_SHARED_DATA")
    return Path(env) if env else HERE.parent.parent / "shared" / "data"


def load_rows() -> list[tuple[int, int, int, float]]:
    import pandas as pd

    path = shared_data() / "operator-profiles/aiconfigurator/h100_sxm/gemm/gemm_perf.parquet"
    if not path.is_file():
        sys.exit(f"aiconfigurator GEMM data not found at {path}; set LLMFABRIC_SHARED_DATA")
    d = pd.read_parquet(path)
    d = d[(d.gemm_dtype == "fp8") & (d.n >= 1024) & (d.k >= 1024)]
    g = d.groupby(["m", "n", "k"]).latency.median().reset_index()
    return [(int(r.m), int(r.n), int(r.k), float(r.latency) * 1e-3) for r in g.itertuples()]


def mape(rows: list[tuple[int, int, int, float]], factor: float) -> float:
    gpu = get_gpu("H100-SXM")
    eff = dataclasses.replace(efficiency_for(gpu), low_precision_compute=factor)
    errs = []
    for m, n, k, t in rows:
        op = OpCost("gemm", 2.0 * m * n * k, float(m * k + n * k + 2 * m * n))
        errs.append(abs(op_time(op, gpu, eff, 8) / t - 1.0))
    return float(np.mean(errs)) * 100.0


def mape_shaped(rows: list[tuple[int, int, int, float]],
                shaped: ShapedLowPrecision | None) -> float:
    """MAPE of the layers' path (`costs._linear_times`: a dense GEMM LinearOp of shape n, k)
    with the given shape-aware model (None: the one factor)."""
    gpu = get_gpu("H100-SXM")
    eff = dataclasses.replace(efficiency_for(gpu), low_precision_shaped=shaped)
    by_nk: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for m, n, k, t in rows:
        by_nk.setdefault((n, k), []).append((m, t))
    errs = []
    for (n, k), mts in by_nk.items():
        op = LinearOp("gemm", 2.0 * n * k, float(n * k), float(k + 2 * n), gemm_n=n, gemm_k=k)
        ms = np.array([m for m, _ in mts], dtype=np.float64)
        pred = _linear_times((op,), ms, gpu, eff, 8)
        errs += [abs(p / t - 1.0) for p, (_, t) in zip(pred.tolist(), mts, strict=True)]
    return float(np.mean(errs)) * 100.0


SHAPED_GRID = {"compute": [round(float(x), 2) for x in np.arange(0.70, 1.001, 0.02)],
               "k0": [128.0, 256.0, 384.0, 512.0, 640.0], "m0": [0.0, 32.0, 64.0, 96.0, 128.0],
               "n0": [512.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="refit the factor on the fit half")
    ap.add_argument("--fit-shaped", action="store_true",
                    help="refit the shape-aware model on the fit half (grid, ~minutes)")
    args = ap.parse_args()
    rows = load_rows()
    fit = [r for r in rows if zlib.crc32(f"{r[:3]}".encode()) % 2 == 0]
    hold = [r for r in rows if zlib.crc32(f"{r[:3]}".encode()) % 2 == 1]
    shipped = efficiency_for(get_gpu("H100-SXM")).low_precision_compute
    if args.fit:
        grid = [round(x, 2) for x in np.arange(0.40, 1.001, 0.01)]
        best = min(grid, key=lambda f: mape(fit, f))
        print(f"fitted low_precision_compute = {best}")
    for name, factor in (("without (1.0)", 1.0), (f"shipped ({shipped})", shipped)):
        print(f"{name}: FP8 GEMM MAPE fit {mape(fit, factor):.1f} % ({len(fit)} shapes), "
              f"holdout {mape(hold, factor):.1f} % ({len(hold)})")
    if args.fit_shaped:
        best: tuple[float, ShapedLowPrecision] | None = None
        for c, k0, m0, n0 in itertools.product(*SHAPED_GRID.values()):
            cand = ShapedLowPrecision(c, k0, m0, n0, 128)
            score = mape_shaped(fit, cand)
            if best is None or score < best[0]:
                best = (score, cand)
        assert best is not None
        print(f"fitted low_precision_shaped = {best[1]}")
    shaped = efficiency_for(get_gpu("H100-SXM")).low_precision_shaped
    print(f"layers' path, shipped shape-aware model {shaped}: FP8 GEMM MAPE fit "
          f"{mape_shaped(fit, shaped):.1f} %, holdout {mape_shaped(hold, shaped):.1f} %; "
          f"with the one factor: fit {mape_shaped(fit, None):.1f} %, "
          f"holdout {mape_shaped(hold, None):.1f} %")


if __name__ == "__main__":
    main()
