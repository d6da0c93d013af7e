"""Time from kill -9 of a serving node until no live node lists it as a routing candidate.

Real nodes on loopback over worker processes; each victim is a node alone in its own worker
process, SERVING a model, killed with SIGKILL (no LEFT announcement). Repeated `--trials`
times with a fresh victim each time.

    python benchmarks/failure_detection.py --nodes 32 --json benchmarks/results/failure.json
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results
from _fleet import Fleet, Worker
from rich.progress import Progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32, help="live nodes (victims come on top)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--preset", default="lan", choices=["local", "lan", "wan"])
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    fleet = Fleet(args.nodes, args.workers, args.preset)
    times: list[float] = []
    phases: list[dict[str, float | None]] = []  # per trial: first and last replica to drop it
    missed = 0
    incomplete = 0  # trials where not every live node routed to the victim before the kill
    try:
        fleet.wait_converged(timeout=120)
        with Progress() as progress:
            task = progress.add_task("kill -9 trials", total=args.trials)
            for _ in range(args.trials):
                victim = Worker(args.preset)
                [(name, _)] = victim.start(1, [fleet.bootstrap_addr])
                victim.call("register", name=name, model="victim-model")
                deadline = time.monotonic() + 30
                ready = False
                while time.monotonic() < deadline:  # every live node routes to it
                    routes = fleet.gather("routes_to", session=name)
                    if all(routes.values()):
                        ready = True
                        break
                    time.sleep(0.1)
                if not ready:  # measuring would credit nodes that never routed to it
                    incomplete += 1
                    victim.kill9()
                    progress.advance(task)
                    continue
                t_kill = time.monotonic()
                victim.kill9()
                gone = None
                while time.monotonic() - t_kill < args.timeout:
                    routes = fleet.gather("routes_to", session=name)
                    if not any(routes.values()):
                        gone = time.monotonic() - t_kill
                        break
                    time.sleep(0.05)
                if gone is None:
                    missed += 1
                else:
                    times.append(gone)
                # when each replica dropped it (wall clock), from the replicas' own listeners
                t_kill_wall = time.time() - (time.monotonic() - t_kill)
                marks = [t - t_kill_wall for t in fleet.gather(
                    "seen", kind="gone", key=name).values() if t is not None]
                phases.append({"first_ms": min(marks) * 1000 if marks else None,
                               "p50_ms": statistics.median(marks) * 1000 if marks else None,
                               "last_ms": max(marks) * 1000 if marks else None})
                progress.advance(task)
                time.sleep(1.0)
    finally:
        fleet.close()
    # A missed trial (still routable somewhere after --timeout) is a failure: it counts as
    # infinitely slow, so the median is None once half the trials missed and max is None
    # with any miss.
    ranked = sorted(times) + [math.inf] * missed
    median = statistics.median(ranked) if ranked else math.inf
    result = {
        "nodes": args.nodes,
        "preset": args.preset,
        "trials": args.trials,
        "missed": missed,
        "incomplete": incomplete,  # not measured: some live node never routed to the victim
        "timeout_s": args.timeout,
        "median_ms": median * 1000 if math.isfinite(median) else None,
        "max_ms": max(times) * 1000 if times and not missed else None,
        "max_observed_ms": max(times) * 1000 if times else None,
        "samples_ms": [t * 1000 for t in times],
        # per measured trial, from the replicas' own change listeners: the first replica to
        # stop routing to the victim (a prober's suspicion) and the median and last one
        "phases": phases,
    }
    notes = (f"{args.nodes} live nodes over {args.workers} worker processes, preset "
             f"`{args.preset}`; polling resolution 50 ms plus one round of queries. A trial "
             f"in which some live node still routed to the victim after {args.timeout:.0f} s "
             "is missed and counts as infinitely slow (median/max None when they fall on "
             "it); a trial in which not every live node routed to the victim within 30 s is "
             "counted as incomplete and not measured.")
    write_results(args.json, result, "Failure detection after kill -9",
                  [{"trials": args.trials, "median_ms": result["median_ms"],
                    "max_ms": result["max_ms"], "missed": missed,
                    "incomplete": incomplete}], notes)


if __name__ == "__main__":
    main()
