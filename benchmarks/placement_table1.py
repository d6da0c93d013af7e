"""The OpenTela paper's placement case (Table 1, Figure 7): CP-SAT vs memP, simulated.

    .venv/bin/python benchmarks/placement_table1.py --json results/placement_table1.json

Cluster: 24 A100-80GB (3 nodes x 8) + 32 GH200 (8 nodes x 4). Workload: Llama-2-13b,
CodeLlama-34b, Llama-3.3-70B at 110, 185.5 and 221 req/s, Poisson, normal lengths
(examples/workload-table1.yaml). Placements are judged three ways, each model fed its
Poisson stream for --duration seconds:
- simulated (headline): requests routed to groups by the plan's load shares, least-outstanding
  within a group (`llmfabric.sim.simulate_cluster`);
- simulated, one LO router: a single least-outstanding router over all of a model's replicas
  (ignores the plan's shares; slow replicas in a mixed group then hold requests longer);
- estimate: the planner's own per-replica estimates at each group's load share.
Target: CP-SAT strictly better than memP in throughput and mean latency. Requests of a load
share no replica takes (memP leaves part of CodeLlama-34b unplaced) count as not completed
and do not enter the mean latency.
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

from llmfabric import sim
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.placement import Placement, evaluate
from llmfabric.scheduler.policies import POLICIES
from llmfabric.scheduler.problem import Problem
from llmfabric.scheduler.simadapter import SimPerformance
from llmfabric.scheduler.spec import load_cluster, load_workload
from llmfabric.scheduler.tables import build_tables

ROOT = Path(__file__).resolve().parent.parent


def simulate(problem: Problem, perf: SimPerformance, placement: Placement, duration: float,
             seed: int, weighted: bool) -> dict[str, Any]:
    """Every model's stream through its replicas; totals over all models.

    weighted: each request goes to a group with the probability of the group's planned load
    share (the router honours the plan), then least-outstanding inside the group; requests of
    a share no group takes are dropped (not completed). Otherwise one least-outstanding router
    over all the model's replicas."""
    done = lat_sum = thr = 0.0
    offered = 0
    per_model: dict[str, Any] = {}
    for load in problem.workload.loads:
        specs = [sim.ReplicaSpec.of(perf._model(g.model), perf._gpu(g.gpu_type), g.tp)
                 for g in placement.groups if g.model == load.model for _ in range(g.replicas)]
        rng = np.random.default_rng(seed)
        ins = np.clip(np.rint(rng.normal(load.mean_in, load.std_in, 2048)), 1, None).astype(int)
        outs = np.clip(np.rint(rng.normal(load.mean_out, load.std_out, 2048)), 1, None)
        wl = sim.poisson(load.arrival_rate, duration, ins.tolist(), outs.astype(int).tolist(),
                         seed)
        offered += len(wl)
        if not specs:
            per_model[load.model] = {"replicas": 0, "completed": 0}
            continue
        groups = [g for g in placement.groups if g.model == load.model]
        parts = []
        if weighted:
            shares = np.array([g.load_share for g in groups] + [
                max(0.0, 1.0 - sum(g.load_share for g in groups))])
            pick = np.random.default_rng(seed + 1).choice(len(shares), size=len(wl),
                                                           p=shares / shares.sum())
            for k, g in enumerate(groups):
                mask = pick == k
                if mask.any():
                    gspecs = [sim.ReplicaSpec.of(perf._model(g.model), perf._gpu(g.gpu_type),
                                                 g.tp)] * g.replicas
                    parts.append(sim.simulate_cluster(gspecs, wl.subset(mask)))
        else:
            parts.append(sim.simulate_cluster(specs, wl))
        completed = sum(r.n_completed for r in parts)
        e2e_sum = sum(r.mean_e2e_s * r.n_completed for r in parts if r.n_completed)
        span = max(r.duration_s for r in parts)
        per_model[load.model] = {"replicas": len(specs), "completed": completed,
                                 "throughput_rps": completed / span,
                                 "mean_e2e_s": e2e_sum / completed if completed else None}
        done += completed
        lat_sum += e2e_sum
        thr += completed / span  # completed / (arrivals + drain), per model
    return {"throughput_rps": thr,
            "mean_latency_s": lat_sum / done if done else float("nan"),
            "completed": done, "offered": offered, "per_model": per_model}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cluster", type=Path, default=ROOT / "examples/cluster-table1.yaml")
    ap.add_argument("--workload", type=Path, default=ROOT / "examples/workload-table1.yaml")
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    problem = Problem(load_cluster(args.cluster), load_workload(args.workload))
    perf = SimPerformance.for_workload(problem.workload)
    options = PlacementOptions(time_limit_s=args.time_limit, workers=args.workers)
    t0 = time.perf_counter()
    tables = build_tables(problem, perf, options)
    build_s = time.perf_counter() - t0
    payload: dict[str, Any] = {"estimate_build_s": build_s, "simulator_calls": perf.calls}
    rows = []
    for key, policy in (("cp", "cpsat"), ("memp", "memp"), ("greedy", "greedy")):
        placement = POLICIES[policy](problem, perf, options, tables)
        est = evaluate(problem, perf, placement)
        simulated = simulate(problem, perf, placement, args.duration, args.seed, True)
        unweighted = simulate(problem, perf, placement, args.duration, args.seed, False)
        payload[key] = {
            "allocation": placement.allocation(),
            "parallelism": {m: {g: list(v) for g, v in row.items()}
                            for m, row in placement.parallelism().items()},
            "throughput_rps": simulated["throughput_rps"],
            "mean_latency_s": simulated["mean_latency_s"],
            "estimate": {"throughput_rps": est.throughput_rps,
                         "mean_latency_s": est.mean_latency_s},
            "simulated": simulated,
            "simulated_unweighted_router": unweighted,
            "status": placement.status, "gap": placement.gap, "solve_s": placement.solve_s,
            "notes": list(placement.notes),
        }
        alloc = "; ".join(f"{m}: " + " + ".join(f"{n}x{g}" for g, n in sorted(row.items()))
                          for m, row in placement.allocation().items())
        rows.append({"policy": policy, "allocation": alloc,
                     "sim throughput (req/s)": simulated["throughput_rps"],
                     "sim mean E2E (s)": simulated["mean_latency_s"],
                     "sim, one LO router: req/s": unweighted["throughput_rps"],
                     "sim, one LO router: E2E (s)": unweighted["mean_latency_s"],
                     "est throughput (req/s)": est.throughput_rps,
                     "est mean E2E (s)": est.mean_latency_s,
                     "status": placement.status, "solve (s)": placement.solve_s})
    cp, mp = payload["cp"], payload["memp"]
    payload["cp_vs_memp"] = {
        "throughput_ratio": cp["throughput_rps"] / mp["throughput_rps"],
        "latency_ratio": cp["mean_latency_s"] / mp["mean_latency_s"],
        "target_met": cp["throughput_rps"] > mp["throughput_rps"]
        and cp["mean_latency_s"] < mp["mean_latency_s"]}
    notes = (f"Offered {problem.workload.total_rate:g} req/s; {args.duration:g} s of Poisson "
             f"arrivals per model. Estimating {perf.calls} simulator points took {build_s:.1f} s."
             f" CP-SAT/memP: throughput x{payload['cp_vs_memp']['throughput_ratio']:.2f}, "
             f"mean latency x{payload['cp_vs_memp']['latency_ratio']:.2f}.")
    write_results(args.json, payload, "Placement, paper Table 1 case: CP-SAT vs memP", rows,
                  notes)


if __name__ == "__main__":
    main()
