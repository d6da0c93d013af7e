"""Flying Serving (issue 15, COMPANIONS §2.7): the priority experiment of Table 1 (F4), the
DP/TP shape of the released code's 4xH200 table (F6), the long-context case (F7, Table 2)
and the torch engine's measured switch cutover (F5), each number beside the paper's.

    .venv/bin/python benchmarks/flying.py --json results/flying.json   # < 1 min

All serving numbers are simulated (sim/flying.py, roofline costs, continuous batching); the
switch cutover is measured on the real CPU engine (engines/torchref, 2 gloo processes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.sim import cost_model, plan_memory, poisson
from llmfabric.sim.flying import FlyingResult, burst_trace, max_context_tokens, simulate_flying
from llmfabric.sim.workload import Workload

MODEL, GPU = "llama-3.1-70b", "H200"


def _ms(x: float) -> float:
    return round(1e3 * x, 1)


def _run(n_gpus: int, base_tp: int, wl: Workload, **kw: Any) -> FlyingResult:
    return simulate_flying(MODEL, GPU, n_gpus, base_tp, wl, **kw)


# the paper's 3-5 req/s leave our TP8 unloaded; from 11-13 req/s on (steps of 1 req/s) it
# queues as the paper's did (mean TTFT 16x DP's; paper 2130 / 166 = 12.8x)
LOADED_RATE = (11.0, 13.0)


def priority_table1(duration: float, seed: int, rate: tuple[float, float] = (3.0, 5.0)
                    ) -> dict[str, Any]:
    """F4: 8xH200, `rate` req/s, 15 % priority; DP = 4 x TP2, TP = 1 x TP8, Flying = 4 TP2
    engines, `priority` policy (width by backlog: TP8 when idle, a TP4 group under a
    backlog, none when saturated), hard preempt, KV kept."""
    rng = np.random.default_rng(seed)
    lens_in = [int(x) for x in rng.integers(256, 2048, 64)]
    lens_out = [int(x) for x in rng.integers(64, 512, 64)]
    wl = burst_trace(rate, rate, 60, 30, duration, lens_in, lens_out, seed=seed)
    prio = (np.random.default_rng(seed + 1).random(len(wl)) < 0.15).astype(int)
    peak_wl = poisson(40.0, 60.0, lens_in, lens_out, seed)
    peak_prio = (np.random.default_rng(seed + 2).random(len(peak_wl)) < 0.15).astype(int)
    setups = {"TP": (8, {"widths": (1,)}), "DP": (2, {"widths": (1,)}),
              "Flying": (2, {"widths": (1, 2, 4), "policy": "priority", "method": "hard"})}
    paper = {"TP": (63, 2130, 22, 22, 2530), "DP": (166, 166, 32, 32, 3164),
             "Flying": (74, 142, 24, 28, 3040)}
    rows = []
    for name, (tp, kw) in setups.items():
        res = _run(8, tp, wl, priority=prio, **kw)
        peak = _run(8, tp, peak_wl, priority=peak_prio, **kw)
        c = res.class_stats()
        p = paper[name]
        rows.append({"system": name, "prio_ttft_ms": _ms(c["priority"]["mean_ttft_s"]),
                     "paper_prio_ttft_ms": p[0], "all_ttft_ms": _ms(c["all"]["mean_ttft_s"]),
                     "paper_all_ttft_ms": p[1], "prio_tpot_ms": _ms(c["priority"]["mean_tpot_s"]),
                     "paper_prio_tpot_ms": p[2], "all_tpot_ms": _ms(c["all"]["mean_tpot_s"]),
                     "paper_all_tpot_ms": p[3],
                     "peak_tok_s": round(peak.serving.output_tokens_per_s),
                     "paper_peak_tok_s": p[4], "switches": res.switches})
    by = {r["system"]: r for r in rows}
    fly, tp_, dp = by["Flying"], by["TP"], by["DP"]
    # no layout's mean TTFT can be below TP8's prefill alone (no queueing at all)
    tp8 = cost_model(MODEL, GPU, tp=8)
    floor = float(np.mean([tp8.prefill_time([int(p)]) for p in wl.input_tokens]))
    checks = {
        "prio_ttft_le_1.3x_TP": fly["prio_ttft_ms"] <= 1.3 * tp_["prio_ttft_ms"],
        "all_ttft_le_1.1x_DP": fly["all_ttft_ms"] <= 1.1 * dp["all_ttft_ms"],
        "all_ttft_lt_0.5x_TP": fly["all_ttft_ms"] < 0.5 * tp_["all_ttft_ms"],
        "peak_ge_0.9x_DP": fly["peak_tok_s"] >= 0.9 * dp["peak_tok_s"],
    }
    return {"rows": rows, "checks": checks, "requests": len(wl), "rate_req_s": list(rate),
            "priority_requests": int(prio.sum()), "tp8_prefill_floor_ms": _ms(floor),
            "half_tp_all_ttft_ms": round(0.5 * tp_["all_ttft_ms"], 1)}


def dp_tp_shape(duration: float, seed: int) -> dict[str, Any]:
    """F6: 4xH200, 4096 in / 256 out, 1 req/s: DP2 x TP2, TP4, Flying (2 TP2 engines,
    hysteresis, soft binds). Paper (repository README): TTFT 786 / 367 / 370 ms,
    TPOT 44.2 / 20.9 / 24.8 ms."""
    wl = poisson(1.0, duration, 4096, 256, seed)
    setups = {"DP2xTP2": (2, {"widths": (1,)}), "TP4": (4, {"widths": (1,)}),
              "Flying": (2, {"widths": (1, 2), "policy": "hysteresis",
                             "method": "soft"})}
    paper = {"DP2xTP2": (786, 44.2), "TP4": (367, 20.9), "Flying": (370, 24.8)}
    rows = []
    for name, (tp, kw) in setups.items():
        res = _run(4, tp, wl, **kw)
        s = res.serving
        rows.append({"system": name, "ttft_ms": _ms(s.mean_ttft_s),
                     "paper_ttft_ms": paper[name][0], "tpot_ms": _ms(s.mean_tpot_s),
                     "paper_tpot_ms": paper[name][1], "switches": res.switches,
                     "time_in_tp_share": round(float(np.mean(res.samples_width > 1)), 3)})
    by = {r["system"]: r for r in rows}
    ttft_ratio = by["DP2xTP2"]["ttft_ms"] / by["TP4"]["ttft_ms"]
    tpot_ratio = by["DP2xTP2"]["tpot_ms"] / by["TP4"]["tpot_ms"]
    fly, tp_ = by["Flying"], by["TP4"]
    checks = {"ttft_ratio_in_[1.3,2.6]": 1.3 <= ttft_ratio <= 2.6,
              "tpot_ratio_in_[1.3,2.6]": 1.3 <= tpot_ratio <= 2.6,
              "flying_ttft_within_10pct_of_TP": fly["ttft_ms"] <= 1.1 * tp_["ttft_ms"],
              "flying_tpot_within_10pct_of_TP": fly["tpot_ms"] <= 1.1 * tp_["tpot_ms"]}
    return {"rows": rows, "ttft_ratio_dp_tp": round(ttft_ratio, 2),
            "paper_ttft_ratio": round(786 / 367, 2), "tpot_ratio_dp_tp": round(tpot_ratio, 2),
            "paper_tpot_ratio": round(44.2 / 20.9, 2), "checks": checks}


def long_context() -> dict[str, Any]:
    """F7 / Table 2: longest single request on 8xH200 (static TP2/TP4/TP8 vs Flying: DP2 x
    TP4 merged to TP8), and one request 1.3x one engine's KV served merged, rejected by DP."""
    table = {f"static_TP{tp}": max_context_tokens(MODEL, GPU, tp, tp) for tp in (2, 4, 8)}
    table["flying_DP2xTP4"] = max_context_tokens(MODEL, GPU, 8, 4, "flying")
    paper = {"static_TP2": 264_000, "static_TP4": 959_000, "static_TP8": 2_300_000,
             "flying_DP2xTP4": 1_900_000}
    rows = [{"layout": k, "max_context_tokens": v, "paper_tokens": paper[k],
             "ratio_to_paper": round(v / paper[k], 2)} for k, v in table.items()]
    one = plan_memory(MODEL, GPU, tp=4).kv_capacity_tokens
    wl = Workload(np.array([0.0]), np.array([int(1.3 * one)], dtype=np.int64),
                  np.array([16], dtype=np.int64))
    dp = _run(8, 4, wl, widths=(1,), policy="context_length")
    fly = _run(8, 4, wl, widths=(1, 2), policy="context_length")
    case = {"request_tokens": int(1.3 * one) + 16, "one_engine_kv_tokens": one,
            "static_dp_completed": dp.serving.n_completed,
            "flying_completed": fly.serving.n_completed,
            "flying_widths": [c.width for c in fly.timeline],
            "flying_ttft_s": round(float(fly.serving.ttft_s[0]), 2)}
    checks = {"served_merged": fly.serving.n_completed == 1,
              "static_dp_cannot": dp.serving.n_completed == 0,
              "flying_within_17pct_of_TP8": table["flying_DP2xTP4"] >= 0.83 * table["static_TP8"]}
    return {"rows": rows, "case": case, "checks": checks}


def torch_switch(switches: int) -> dict[str, Any]:
    """F5: cutover of the real CPU engine (2 processes, tiny-llama), idle and loaded."""
    try:
        from torchref_switch import cutover

        from llmfabric.engines.torchref.config import load_config
        from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
    except ImportError as exc:  # the torch extra is not installed
        return {"skipped": f"torch engine unavailable: {exc}"}
    with FlyingEngine(EngineOptions(config=load_config("tiny-llama"), dp=2,
                                    widths=(1, 2))) as eng:
        rows = [cutover(eng, switches, False), cutover(eng, switches, True)]
    return {"rows": rows, "goal_ms": 50, "paper_sim_ms": 15, "paper_readme_gpu_ms": 10,
            "checks": {"cutover_lt_50ms": all(r["cutover_ms_max"] < 50 for r in rows)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals")
    ap.add_argument("--switches", type=int, default=10, help="torch engine round trips")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "priority_table1": priority_table1(args.duration, args.seed),
        "priority_table1_loaded": priority_table1(args.duration, args.seed, LOADED_RATE),
        "dp_tp_shape": dp_tp_shape(args.duration, args.seed),
        "long_context": long_context(),
        "torch_switch": torch_switch(args.switches),
    }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    checks = {f"{k}.{c}": v for k, sec in out.items() if isinstance(sec, dict)
              for c, v in sec.get("checks", {}).items()}
    out["all_checks_pass"] = all(checks.values())
    p1, p2 = out["priority_table1"], out["priority_table1_loaded"]
    notes = ["Priority (Table 1, 8xH200, Llama-3.1-70B, 3-5 req/s, 15 % priority):", "",
             _table(p1["rows"]),
             f"TP8 prefill floor {p1['tp8_prefill_floor_ms']} ms vs 0.5 x TP all TTFT "
             f"{p1['half_tp_all_ttft_ms']} ms.", "",
             f"Priority at {p2['rate_req_s']} req/s (TP8 queues):", "", _table(p2["rows"]), "",
             "DP/TP shape (4xH200, 4096/256, 1 req/s):", "", _table(out["dp_tp_shape"]["rows"]),
             f"TTFT ratio DP/TP {out['dp_tp_shape']['ttft_ratio_dp_tp']} (paper "
             f"{out['dp_tp_shape']['paper_ttft_ratio']}), TPOT ratio "
             f"{out['dp_tp_shape']['tpot_ratio_dp_tp']} (paper "
             f"{out['dp_tp_shape']['paper_tpot_ratio']}).", "",
             "Long context (Table 2):", "", _table(out["long_context"]["rows"]),
             f"Case: {out['long_context']['case']}", "",
             f"Torch engine switch: {out['torch_switch']}", "", "Checks:"]
    rows = [{"check": k, "pass": v} for k, v in checks.items()]
    write_results(args.json, out, "Flying Serving: priority, DP/TP shape, long context, "
                  "switch time", rows, "\n".join(notes), ["check", "pass"])


def _table(rows: list[dict[str, Any]]) -> str:
    from _common import markdown_table

    return markdown_table(rows)


if __name__ == "__main__":
    main()
