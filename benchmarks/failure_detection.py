"""Time from kill -9 of a serving node until no live node lists it as a routing candidate.

Real nodes on loopback over worker processes; each victim is a node alone in its own worker
process, SERVING a model, killed with SIGKILL (no LEFT announcement). Repeated `--trials`
times with a fresh victim each time.

    python benchmarks/failure_detection.py --nodes 32 --json benchmarks/results/failure.json
"""

from __future__ import annotations

import argparse
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
    missed = 0
    try:
        fleet.wait_converged(timeout=120)
        with Progress() as progress:
            task = progress.add_task("kill -9 trials", total=args.trials)
            for _ in range(args.trials):
                victim = Worker(args.preset)
                [(name, _)] = victim.start(1, [fleet.bootstrap_addr])
                victim.call("register", name=name, model="victim-model")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # every live node routes to it
                    routable = fleet.gather("routable")
                    if all(name in r for r in routable.values()):
                        break
                    time.sleep(0.1)
                t_kill = time.monotonic()
                victim.kill9()
                gone = None
                while time.monotonic() - t_kill < args.timeout:
                    routable = fleet.gather("routable")
                    if all(name not in r for r in routable.values()):
                        gone = time.monotonic() - t_kill
                        break
                    time.sleep(0.05)
                if gone is None:
                    missed += 1
                else:
                    times.append(gone)
                progress.advance(task)
                time.sleep(1.0)
    finally:
        fleet.close()
    result = {
        "nodes": args.nodes,
        "preset": args.preset,
        "trials": args.trials,
        "missed": missed,
        "median_ms": statistics.median(times) * 1000 if times else None,
        "max_ms": max(times) * 1000 if times else None,
        "samples_ms": [t * 1000 for t in times],
    }
    notes = (f"{args.nodes} live nodes over {args.workers} worker processes, preset "
             f"`{args.preset}`; polling resolution 50 ms plus one round of queries.")
    write_results(args.json, result, "Failure detection after kill -9",
                  [{"median_ms": result["median_ms"], "max_ms": result["max_ms"],
                    "missed": missed}], notes)


if __name__ == "__main__":
    main()
