"""How fast a join and a model registration reach every replica, and what gossip costs.

Real nodes (TLS transport, gossip, SWIM, HTTP API) on loopback, several per worker process.
For a join event (a new node starts) and a registration event (a node starts SERVING a model)
it reports p50/p95/p100 milliseconds until each other node's replica has it, and the bytes
each node sends per second while idle and while those events spread.

    python benchmarks/gossip_convergence.py --nodes 128 --json benchmarks/results/gossip.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results
from _fleet import Fleet, percentiles
from rich.console import Console

from llmfabric.gossip.config import PRESETS


def wait_seen(fleet: Fleet, kind: str, key: str, t0: float, exclude: str,
              timeout: float) -> tuple[list[float], int]:
    """Latencies of the replicas that saw the event, and how many never did (a replica in a
    worker that died counts as missing too)."""
    expected = {n for w in fleet.workers for n in w.names} - {exclude}
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = {n: t for n, t in fleet.gather("seen", kind=kind, key=key).items()
                if n in expected and t is not None}
        if len(seen) == len(expected):
            break
        time.sleep(0.1)
    return [t - t0 for t in seen.values()], len(expected) - len(seen)


def total_bytes(fleet: Fleet) -> int:
    return sum(fleet.gather("bytes").values())


def idle_window(fleet: Fleet, seconds: float) -> tuple[float, dict[str, float]]:
    """Bytes per node per second over `seconds` with no events, and what the fleet did
    meanwhile (messages by kind, suspicions, refutations, connection set-ups, ...)."""
    s0 = fleet.stats()
    b0, t0 = total_bytes(fleet), time.monotonic()
    time.sleep(seconds)
    rate = (total_bytes(fleet) - b0) / (time.monotonic() - t0) / fleet.size
    s1 = fleet.stats()
    return rate, {k: v - s0.get(k, 0) for k, v in sorted(s1.items()) if v - s0.get(k, 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4, help="worker processes hosting nodes")
    ap.add_argument("--preset", default="lan", choices=["local", "lan", "wan"])
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=10.0,
                    help="seconds after convergence before the first idle window")
    ap.add_argument("--steady-settle", type=float, default=None,
                    help="seconds after convergence before the steady-state idle window "
                         "[one SWIM probe round: nodes x probe interval]")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    console = Console(stderr=True)
    with console.status(f"starting {args.nodes - 1} nodes on {args.workers} workers"):
        fleet = Fleet(args.nodes - 1, args.workers, args.preset)
    try:
        with console.status("waiting for the replicas to converge"):
            try:
                converge_s: float | None = fleet.wait_converged(timeout=120)
            except TimeoutError as exc:  # reported, and the events are measured anyway
                console.print(f"[red]{exc}")
                converge_s = None
        converged_at = time.monotonic()
        steady_settle = (args.steady_settle if args.steady_settle is not None
                         else args.nodes * PRESETS[args.preset].probe_interval_s)
        with console.status(f"measuring idle traffic for {args.idle_seconds}s"):
            # Two windows: soon after start-up (every node is still in its first SWIM probe
            # round, opening TLS connections to peers it has not met), and the steady state
            # after one full probe round (what an idle fabric costs).
            time.sleep(args.settle)
            idle_start, start_events = idle_window(fleet, args.idle_seconds)
            time.sleep(max(0.0, converged_at + steady_settle - time.monotonic()))
            idle, idle_events = idle_window(fleet, args.idle_seconds)

        b_active, t_active = total_bytes(fleet), time.monotonic()
        t0 = time.time()
        [(new_name, _)] = fleet.workers[-1].start(1, [fleet.bootstrap_addr])
        join, join_missing = wait_seen(fleet, "session", new_name, t0, new_name, 15.0)

        target = fleet.workers[0].names[-1]
        t1 = fleet.workers[0].call("register", name=target, model="bench-model")
        reg, reg_missing = wait_seen(fleet, "model", "bench-model", t1, target, 15.0)
        active = (total_bytes(fleet) - b_active) / (time.monotonic() - t_active) / fleet.size
        totals = fleet.stats()  # the whole run, start-up included
    finally:
        fleet.close()

    join_p, reg_p = percentiles(join, join_missing), percentiles(reg, reg_missing)
    result = {
        "nodes": args.nodes,
        "workers": args.workers,
        "preset": args.preset,
        "initial_convergence_s": converge_s,
        "join": join_p,
        "register": reg_p,
        "wait_s": 15.0,  # how long a replica had before it counted as missing
        "idle_bytes_per_node_s": idle,  # steady state: after one full probe round
        "idle_steady_after_s": steady_settle,
        "idle_after_start_bytes_per_node_s": idle_start,  # `--settle` s after convergence
        "idle_after_start_events": start_events,
        "active_bytes_per_node_s": active,
        "bytes_counted": "transport frames (payload + frame header), TLS and TCP/IP excluded",
        "idle_events": idle_events,
        "run_totals": {k: v for k, v in totals.items() if not k.startswith("msgs_out")},
    }
    rows = [
        {"event": "join", **join_p},
        {"event": "register", **reg_p},
    ]
    notes = (f"{args.nodes} nodes over {args.workers} worker processes on loopback, preset "
             f"`{args.preset}`. Idle: {idle:.0f} B/s per node in the steady state ("
             f"{steady_settle:.0f} s after convergence, one probe round), {idle_start:.0f} B/s "
             f"{args.settle:.0f} s after convergence; during the events: "
             f"{active:.0f} B/s per node (bytes of the transport's frames: payload + 6-byte "
             "frame header; TLS record overhead and TCP/IP headers are not counted). A replica "
             "that had not seen an event after 15 s counts as missing (its latency as "
             "infinite: a percentile that falls on a miss is shown as None).")
    write_results(args.json, result, "Gossip convergence", rows, notes)


if __name__ == "__main__":
    main()
