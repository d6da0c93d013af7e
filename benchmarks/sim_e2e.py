"""End-to-end serving fidelity: replay every measured row of the e2e calibration file.

    .venv/bin/python benchmarks/sim_e2e.py --json results/sim_e2e.json     # (+ .md)
    .venv/bin/python benchmarks/sim_e2e.py --fit      # refit the engine profiles' CPU terms

Data: `e2e/serving_e2e_calibration.csv` in the shared data directory ($LLMFABRIC_SHARED_DATA,
default ../shared/data; see its README for source and licence): real vLLM, SGLang and
TensorRT-LLM runs at a fixed concurrency. Every row is replayed by `llmfabric.sim.e2e.replay`
(the same method as `llmfabric simulate e2e`): a closed loop at the row's concurrency with the
row's engine profile, steady-state means (first wave excluded).

Split inside the file: HOLDOUT = every B200 and GB200 row (two whole GPUs) and every
Llama-3.1-8B row (a whole model); FIT = the rest (H100: Qwen3-32B on all three engines,
Llama-3.1-70B on vLLM). `--fit` fits only the engine profiles' CPU and client terms
(per-step, per-sequence and per-prompt-step CPU time, front-end latency, client jitter) per
backend on the FIT rows, by coordinate descent over a grid, and prints them; the shipped
values live in `llmfabric/sim/profiles.py`. The GPU efficiency factors are NOT fitted here
(they come from the operator benchmark, `sim_accuracy.py`; B200/GB200 borrow the H100 row).

Reported: TTFT and TPOT MAPE overall, on the fit and holdout rows, per GPU and per backend,
the GPU ordering (for every pair of rows that differ only in the GPU, does the simulator
order the two GPUs as the measurement does, for TTFT and for TPOT), and a `breakdown` of
where the error is (MAPE, median predicted/measured ratio and signed error per set-up,
concurrency, ISL/OSL and TP, and per backend by GPU, concurrency, ISL, OSL and TP, fit and
holdout apart; the worst TTFT rows); `*_mpe` columns: the signed mean percentage error
(> 0: predicted too slow). Each row's prediction averages
`--runs` closed loops (default 4) with independent client drift: how clients cluster
differs from draw to draw, and a fit against one draw fits its clusters
(docs/simulator.md "Second pass").
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.sim import e2e, e2e_correction
from llmfabric.sim.profiles import PROFILES, EngineProfile

HERE = Path(__file__).resolve().parent
HOLDOUT_GPUS = ("b200_sxm", "gb200")
HOLDOUT_MODELS = ("meta-llama/Llama-3.1-8B-Instruct",)
FIT_PARAMS: dict[str, tuple[float, ...]] = {
    "step_cpu_s": (0.0, 0.5e-3, 1e-3, 2e-3, 3e-3, 5e-3),
    "step_cpu_per_seq_s": (0.0, 5e-6, 1e-5, 2e-5, 4e-5, 8e-5),
    "request_overhead_s": (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12),
    "output_jitter_tokens": (0.0, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 25.0, 40.0, 60.0, 100.0,
                             150.0, 250.0),
    "client_jitter_s": (0.0, 0.01, 0.03, 0.1, 0.3, 1.0),
    "prompt_step_cpu_s": (0.0, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03),
}


def shared_data() -> Path:
    env = os.environ.get("LLMFABRIC_SHARED_DATA")
    return Path(env) if env else HERE.parent.parent / "shared" / "data"


def fold(row: e2e.E2ERow | dict[str, Any]) -> str:
    gpu = row.gpu if isinstance(row, e2e.E2ERow) else row["gpu"]
    model = row.model if isinstance(row, e2e.E2ERow) else row["model"]
    return "holdout" if gpu in HOLDOUT_GPUS or model in HOLDOUT_MODELS else "fit"


def osl_response(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """How TTFT answers the output length, measured and simulated, per model, GPU and engine:
    the median over (set-up but OSL, concurrency) of TTFT at the longest OSL / at the
    shortest. ~1: TTFT independent of OSL (as every fit row's engine); the TensorRT-LLM
    holdout campaigns answer with opposite signs (docs/simulator.md "Fifth pass")."""
    rest = tuple(c for c in (*e2e.SET_UP, "concurrency") if c != "osl")
    curves: dict[tuple[Any, ...], dict[int, dict[str, Any]]] = {}
    for r in records:
        if "error" not in r:
            curves.setdefault(tuple(r[c] for c in rest), {})[r["osl"]] = r
    ratios: dict[str, list[tuple[float, float]]] = {}
    for by_osl in curves.values():
        if len(by_osl) < 2:
            continue
        lo, hi = by_osl[min(by_osl)], by_osl[max(by_osl)]
        name = f"{_short(lo['model'])} {lo['gpu']} {lo['backend']}"
        ratios.setdefault(name, []).append((hi["ttft_ms"] / lo["ttft_ms"],
                                            hi["pred_ttft_ms"] / lo["pred_ttft_ms"]))
    return {name: {"curves": len(v),
                   "measured_median": sorted(m for m, _ in v)[len(v) // 2],
                   "simulated_median": sorted(p for _, p in v)[len(v) // 2]}
            for name, v in sorted(ratios.items())}


def gpu_ordering(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs of rows equal in everything but the GPU: is the faster GPU predicted faster?"""
    keys = ("model", "backend", "precision", "gemm_quant", "tp", "isl", "osl", "concurrency")
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in records:
        if "error" not in r:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out: dict[str, Any] = {"pairs": 0, "ttft_right": 0, "tpot_right": 0, "wrong": []}
    for rows in groups.values():
        for a, b in itertools.combinations(rows, 2):
            if a["gpu"] == b["gpu"]:
                continue
            out["pairs"] += 1
            for metric in ("ttft", "tpot"):
                meas = a[f"{metric}_ms"] - b[f"{metric}_ms"]
                pred = a[f"pred_{metric}_ms"] - b[f"pred_{metric}_ms"]
                if meas * pred > 0:
                    out[f"{metric}_right"] += 1
                else:
                    out["wrong"].append({"metric": metric, **{k: a[k] for k in keys},
                                         "gpus": [a["gpu"], b["gpu"]],
                                         "measured_ms": [a[f"{metric}_ms"], b[f"{metric}_ms"]],
                                         "predicted_ms": [a[f"pred_{metric}_ms"],
                                                          b[f"pred_{metric}_ms"]]})
    return out


def _short(model: str) -> str:
    return model.rsplit("/", 1)[-1]


BREAKDOWN_KEYS: dict[str, tuple[str, ...]] = {
    "set_up": ("fold", "gpu", "backend", "model", "gemm_quant"),
    "concurrency": ("fold", "concurrency"),
    "isl_osl": ("fold", "isl", "osl"),
    "tp": ("fold", "tp"),
    "gpu_backend": ("fold", "gpu", "backend"),
    "backend_concurrency": ("fold", "backend", "concurrency"),
    "backend_isl": ("fold", "backend", "isl"),
    "backend_osl": ("fold", "backend", "osl"),
    "backend_tp": ("fold", "backend", "tp"),
}


def signed(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Signed error of the rows: mean percentage error (pred/meas - 1, in %; > 0 = the
    simulator is slow) and the geometric-mean ratio pred/meas, for TTFT and TPOT."""
    ok = [r for r in recs if "error" not in r and not math.isnan(r["pred_ttft_ms"])
          and not math.isnan(r["ttft_ms"])]
    out: dict[str, float] = {}
    for m in ("ttft", "tpot"):
        ratios = [r[f"pred_{m}_ms"] / r[f"{m}_ms"] for r in ok]
        out[f"{m}_mpe"] = 100.0 * sum(x - 1 for x in ratios) / len(ok) if ok else math.nan
        out[f"{m}_gmean_ratio"] = (math.exp(sum(math.log(x) for x in ratios) / len(ok))
                                   if ok else math.nan)
    return out


def breakdown(records: list[dict[str, Any]], worst: int = 15) -> dict[str, Any]:
    """Where the error is: MAPE, the median predicted/measured ratio and the signed error
    (`signed`) per group (set-up, concurrency, ISL/OSL, TP, and per backend by GPU,
    concurrency, ISL, OSL and TP; fit and holdout apart) and the worst TTFT rows."""
    ok = [r for r in records if "error" not in r and not math.isnan(r["pred_ttft_ms"])]
    out: dict[str, Any] = {}
    for name, keys in BREAKDOWN_KEYS.items():
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in ok:
            groups.setdefault(tuple(_short(r[k]) if k == "model" else r[k] for k in keys),
                              []).append(r)
        rows = []
        for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
            g = groups[key]
            ratios = {m: sorted(x[f"pred_{m}_ms"] / x[f"{m}_ms"] for x in g)
                      for m in ("ttft", "tpot")}
            rows.append({**dict(zip(keys, key, strict=True)), "n": len(g),
                         **{f"{m}_mape": 100.0 * sum(abs(v - 1) for v in ratios[m]) / len(g)
                            for m in ratios},
                         **{f"{m}_median_ratio": ratios[m][len(g) // 2] for m in ratios},
                         **signed(g)})
        out[name] = rows
    ranked = sorted(ok, key=lambda r: -abs(r["pred_ttft_ms"] / r["ttft_ms"] - 1))
    out["worst_ttft"] = [{k: r[k] for k in (*e2e.COLUMNS, "pred_ttft_ms", "pred_tpot_ms",
                                            "fold")} for r in ranked[:worst]]
    return out


def _objective(summary: dict[str, Any]) -> float:
    block = summary["all"]
    if not block["n"]:
        return math.inf
    return float(block["ttft_mape"] + block["tpot_mape"])


def fit_profiles(rows: list[e2e.E2ERow], waves: int, backends: list[str] | None = None,
                 runs: int = e2e.DEFAULT_RUNS,
                 params: list[str] | None = None) -> dict[str, EngineProfile]:
    """Coordinate descent per backend over FIT_PARAMS (or the named subset) on the given
    (fit) rows."""
    grids = {k: v for k, v in FIT_PARAMS.items() if params is None or k in params}
    fitted = dict(PROFILES)
    for backend in backends or sorted({r.backend for r in rows}):
        mine = [r for r in rows if r.backend == backend]
        prof = PROFILES[backend]

        def score(p: EngineProfile, mine: list[e2e.E2ERow] = mine,
                  backend: str = backend) -> float:
            return _objective(e2e.replay(mine, waves=waves, profiles={backend: p},
                                         runs=runs)["summary"])

        best = score(prof)
        for _sweep in range(2):
            changed = False
            for name, grid in grids.items():
                for value in grid:
                    cand = dataclasses.replace(prof, **{name: value})
                    s = score(cand)
                    if s < best - 1e-9:
                        best, prof, changed = s, cand, True
            if not changed:
                break
        print(f"{backend}: objective {best:.2f} "
              + ", ".join(f"{k}={getattr(prof, k)}" for k in FIT_PARAMS), flush=True)
        fitted[backend] = prof
    return fitted


def replay_campaigns(rows: list[e2e.E2ERow], drift: float, waves: int,
                     profiles: dict[str, EngineProfile] | None, runs: int) -> dict[str, Any]:
    """EXPERIMENT (`--campaign-drift`): client desynchronization as a property of the
    measuring campaign instead of the engine. The rows without a `backend_version` (every
    Llama-3.1-70B row: H100 vLLM, B200 vLLM and TensorRT-LLM; another workload grid, ISL/OSL
    1024/8192) get output drift -/+ `drift` tokens and no client delay whatever the engine;
    the other rows keep their profiles. The drift is chosen on that campaign's FIT rows
    (H100 vLLM) only (docs/simulator.md "Fourth pass")."""
    base = profiles or PROFILES
    mine = {b: dataclasses.replace(p, output_jitter_tokens=drift, client_jitter_s=0.0)
            for b, p in base.items()}
    versionless = [i for i, r in enumerate(rows) if not r.backend_version]
    other = [i for i, r in enumerate(rows) if r.backend_version]
    recs: list[dict[str, Any]] = [{} for _ in rows]
    for idx, profs in ((versionless, mine), (other, dict(base))):
        part = e2e.replay([rows[i] for i in idx], waves=waves, profiles=profs, runs=runs)
        for i, rec in zip(idx, part["rows"], strict=True):
            recs[i] = rec
    return {"rows": recs, "summary": e2e.summarize(recs)}


def _split_summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE of all, fit and holdout rows, with each block's monotone floor (`e2e.monotone_floor`:
    the least error the rows' own disorder in concurrency leaves any simulator)."""
    summary = e2e.summarize(recs, floors=True)
    summary["fit"] = e2e.summarize([r for r in recs if r["fold"] == "fit"], floors=True)["all"]
    summary["holdout"] = e2e.summarize([r for r in recs if r["fold"] == "holdout"], floors=True)
    return summary


def calibrated_report(recs: list[dict[str, Any]], ridge: float) -> dict[str, Any]:
    """The residual layer (`sim.e2e_correction`) fitted on the FIT rows, applied to all rows;
    plus how it transfers: leave-one-set-up-out inside the fit rows (the evidence a choice
    may use), and leave-one-GPU-out / leave-one-model-out over all rows (the correction
    fitted on every other row)."""
    corr = e2e_correction.fit_correction([r for r in recs if r["fold"] == "fit"], ridge=ridge)
    cal = corr.apply(recs)
    fit_rows = [dict(r, set_up=f"{_short(r['model'])} {r['backend']} {r['gpu']} "
                                f"{r['gemm_quant'] or 'bf16'}")
                for r in recs if r["fold"] == "fit"]
    return {
        "correction": corr.as_dict(),
        "summary": _split_summary(cal),
        "gpu_ordering": {k: v for k, v in gpu_ordering(cal).items() if k != "wrong"},
        "leave_one_setup_out_fit": e2e_correction.leave_one_group_out(fit_rows, "set_up",
                                                                      ridge=ridge),
        "leave_one_gpu_out": e2e_correction.leave_one_group_out(recs, "gpu", ridge=ridge),
        "leave_one_model_out": e2e_correction.leave_one_group_out(recs, "model", ridge=ridge),
        "rows": [{k: r[k] for k in ("pred_ttft_ms", "pred_tpot_ms")} for r in cal],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None, help="write JSON here (+ .md)")
    ap.add_argument("--csv", type=Path, default=None,
                    help="rows to replay (default: the shared calibration file)")
    ap.add_argument("--waves", type=int, default=e2e.DEFAULT_WAVES,
                    help="requests per client in each closed loop")
    ap.add_argument("--fit", action="store_true", help="refit the profiles on the fit rows")
    ap.add_argument("--fit-backends", default=None,
                    help="comma-separated backends to refit (default: all)")
    ap.add_argument("--fit-params", default=None,
                    help="comma-separated profile terms to refit (default: all of FIT_PARAMS)")
    ap.add_argument("--runs", type=int, default=e2e.DEFAULT_RUNS,
                    help="closed loops (seeds) averaged per row")
    ap.add_argument("--campaign-drift", type=float, default=None,
                    help="EXPERIMENT: closed-loop output drift (tokens, no client delay) for "
                         "the rows of the campaign without a backend_version, every engine")
    ap.add_argument("--ridge", type=float, default=1.0,
                    help="ridge penalty of the residual layer (fitted on the FIT rows)")
    args = ap.parse_args()
    path = args.csv or shared_data() / "e2e" / "serving_e2e_calibration.csv"
    if not path.is_file():
        sys.exit(f"e2e calibration data not found at {path}; set LLMFABRIC_SHARED_DATA")
    rows = e2e.read_rows(path)
    profiles = None
    if args.fit:
        only = args.fit_backends.split(",") if args.fit_backends else None
        names = args.fit_params.split(",") if args.fit_params else None
        profiles = fit_profiles([r for r in rows if fold(r) == "fit"], args.waves, only,
                                args.runs, names)
    t0 = time.perf_counter()
    if args.campaign_drift is None:
        out = e2e.replay(rows, waves=args.waves, profiles=profiles, runs=args.runs)
    else:
        out = replay_campaigns(rows, args.campaign_drift, args.waves, profiles, args.runs)
    wall = time.perf_counter() - t0
    recs = out["rows"]
    for r in recs:
        r["fold"] = fold(r)
    summary = _split_summary(recs)
    ordering = gpu_ordering(recs)
    calibrated = calibrated_report(recs, args.ridge)
    csum = calibrated["summary"]

    def line(name: str, v: dict[str, Any], c: dict[str, Any],
             recs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        sig = signed(recs) if recs is not None else {}
        # what a TTFT the same at every output length (as the fit rows' is) cannot go below
        flat = (e2e.flat_floor([r for r in recs if "error" not in r], "ttft_ms", "osl")
                if recs is not None else math.nan)
        return {"rows": name, **v, "ttft_mpe": sig.get("ttft_mpe", math.nan),
                "tpot_mpe": sig.get("tpot_mpe", math.nan), "cal_ttft_mape": c["ttft_mape"],
                "cal_tpot_mape": c["tpot_mape"], "ttft_osl_floor": flat}

    hold = [r for r in recs if r["fold"] == "holdout"]
    table = [line("all", summary["all"], csum["all"], recs),
             line("fit", summary["fit"], csum["fit"], [r for r in recs if r["fold"] == "fit"]),
             line("holdout", summary["holdout"]["all"], csum["holdout"]["all"], hold)]
    for part, key in (("by_gpu", "gpu"), ("by_backend", "backend")):
        table += [line(f"{part[3:]} {g}", v, csum[part][g], [r for r in recs if r[key] == g])
                  for g, v in summary[part].items()]
        table += [line(f"holdout {part[3:]} {g}", v, csum["holdout"][part][g],
                       [r for r in hold if r[key] == g])
                  for g, v in summary["holdout"][part].items()]
    for name in ("leave_one_setup_out_fit", "leave_one_gpu_out", "leave_one_model_out"):
        table += [line(f"{name} {_short(g)}", v["analytic"], v["calibrated"])
                  for g, v in calibrated[name].items()]
    payload = {
        "ttft_mape_all": summary["all"]["ttft_mape"],
        "tpot_mape_all": summary["all"]["tpot_mape"],
        "ttft_mape_holdout": summary["holdout"]["all"]["ttft_mape"],
        "signed": {"all": signed(recs), "fit": signed([r for r in recs if r["fold"] == "fit"]),
                   "holdout": signed(hold)},
        "tpot_mape_holdout": summary["holdout"]["all"]["tpot_mape"],
        "target_mape_holdout": 10.0,
        "gpu_ordering": ordering,
        "osl_response": osl_response(recs),
        "breakdown": breakdown(recs),
        "calibrated": calibrated,
        "profiles": {k: dataclasses.asdict(v) for k, v in (profiles or PROFILES).items()},
        "split": {"holdout_gpus": HOLDOUT_GPUS, "holdout_models": HOLDOUT_MODELS},
        "campaign_drift": args.campaign_drift,
        "waves": args.waves, "runs": args.runs, "wall_s": wall, "summary": summary, "rows": recs,
    }
    write_results(args.json, payload, "Simulator end-to-end serving fidelity", table,
                  notes=f"{len(recs)} measured rows replayed in {wall:.1f} s; MAPE in percent. "
                        f"Holdout: GPUs {', '.join(HOLDOUT_GPUS)} and "
                        f"{', '.join(HOLDOUT_MODELS)}. GPU ordering: {ordering['ttft_right']}"
                        f" / {ordering['pairs']} pairs right for TTFT, "
                        f"{ordering['tpot_right']} / {ordering['pairs']} for TPOT. "
                        "cal_*: with the residual layer fitted on the fit rows (leave-one-*-out "
                        "rows: fitted on every other row; docs/simulator.md \"Third pass\"). "
                        "*_floor: the least MAPE any prediction that never falls as concurrency "
                        "rises could reach on those rows; ttft_osl_floor: the least any TTFT "
                        "the same at every output length could (docs/simulator.md \"Fifth "
                        "pass\").",
                  columns=("rows", "n", "ttft_mape", "tpot_mape", "ttft_mpe", "tpot_mpe",
                           "cal_ttft_mape", "cal_tpot_mape", "ttft_floor", "tpot_floor",
                           "ttft_osl_floor"))


if __name__ == "__main__":
    main()
