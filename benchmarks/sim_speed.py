"""Simulator speed: simulated requests per wall-clock second, 1 replica and 16 replicas.

    .venv/bin/python benchmarks/sim_speed.py --json results/sim_speed.json

Workload: Llama-3.1-8B on H100, Poisson arrivals, 512 input / 256 output tokens, at ~60 %
of each replica's sustainable load (the batch holds tens of sequences, so stretches and
preemption-free decode dominate, as in planning runs). Target >= 10,000 requests/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.sim import ReplicaSpec, cost_model, poisson, simulate_cluster


def _run(n_replicas: int, rate_per_replica: float, n_requests: int, router: str,
         repeats: int) -> dict[str, float]:
    rate = rate_per_replica * n_replicas
    wl = poisson(rate, n_requests / rate, 512, 256, seed=1)
    specs = [ReplicaSpec.of("llama-3.1-8b", "H100")] * n_replicas
    cost_model("llama-3.1-8b", "H100")  # warm the cost-model cache (not the measured part)
    best = best_cpu = float("inf")
    res = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate_cluster(specs, wl, router=router)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert res is not None
    return {"replicas": n_replicas, "router": router, "requests": len(wl),
            "wall_s": best, "requests_per_s": len(wl) / best,
            "requests_per_cpu_s": len(wl) / best_cpu,
            "sim_throughput_rps": res.throughput_rps, "mean_batch_busy":
            float(res.utilisation.busy_fraction.mean()), "mean_e2e_s": res.mean_e2e_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=None, help="write JSON here (+ .md)")
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--rate-per-replica", type=float, default=12.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = [
        _run(1, args.rate_per_replica, args.requests, "round_robin", args.repeats),
        _run(16, args.rate_per_replica, args.requests, "round_robin", args.repeats),
        _run(16, args.rate_per_replica, args.requests, "least_outstanding", args.repeats),
    ]
    payload = {
        "requests_per_s_1_replica": rows[0]["requests_per_s"],
        "requests_per_s_16_replicas": min(rows[1]["requests_per_s"], rows[2]["requests_per_s"]),
        "target_requests_per_s": 10_000,
        "runs": rows,
    }
    write_results(args.json, payload, "Simulator speed", rows,
                  notes="Simulated requests per wall-clock second (best of repeats) and per "
                        "CPU second of this process (less sensitive to a loaded machine). "
                        "16-replica figure in the JSON is the slower router.")


if __name__ == "__main__":
    main()
