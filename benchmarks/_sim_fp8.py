"""FP8 GEMM efficiency: aiconfigurator's H100 FP8 GEMMs (CUTLASS scaled-mm, vLLM) against the
cost model, to fit `Efficiency.low_precision_compute` (the share of the BF16-fitted `compute`
factor that FP8 GEMMs reach at their doubled peak).

    .venv/bin/python benchmarks/_sim_fp8.py [--fit]

Rows: every FP8 GEMM with n, k >= 1024 (the projection shapes of served models); split in
two by a stable hash of (m, n, k); the factor is fitted on the FIT half (grid 0.40-1.00) and
MAPE is reported on both halves. Read at run time from the shared data directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from llmfabric.sim import efficiency_for, get_gpu
from llmfabric.sim.costs import op_time
from llmfabric.sim.operators import OpCost

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="refit the factor on the fit half")
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


if __name__ == "__main__":
    main()
