"""The gossip broadcast queue's cost per operation, at the queue sizes a node sees.

    .venv/bin/python benchmarks/broadcast_queue.py --json results/broadcast_queue.json

Every message a node sends or receives with fresh items takes from the queue (a piggyback
on each probe and ack, a flush to `fanout` peers after each fresh item), so a take is on the
hot path; a push follows every fresh item. Sizes: a quiet fleet (8), churn at scale (64,
512) and a queue held full by a flood of rumours (4,096, `GossipConfig.max_queued`).
Each round pushes one fresh 300-byte rumour (evicting when full) and takes a piggyback
budget (1,200 bytes, as the `lan` preset) with a retransmit limit no item reaches, so the
queue stays at its size. To compare two versions, run this file with each version's `src/`
on PYTHONPATH, back to back.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.gossip.broadcast import BroadcastQueue

SIZES = (8, 64, 512, 4096)


def _measure(size: int, rounds: int) -> dict[str, float]:
    q = BroadcastQueue(max_items=size)
    items = [(1, os.urandom(236), os.urandom(64)) for _ in range(size + rounds)]
    for i in range(size):
        q.push(("f", i), items[i])
    t0 = time.perf_counter()
    for r in range(rounds):
        q.push(("f", size + r), items[size + r])
        q.take(1200, 10**9)
    per_round = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    for _ in range(rounds):
        q.take(1200, 10**9)
    per_take = (time.perf_counter() - t0) / rounds
    return {"queued": size, "push_take_us": per_round * 1e6, "take_us": per_take * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [_measure(n, args.rounds) for n in SIZES]
    write_results(args.json, {"rounds": args.rounds, "rows": rows},
                  "Gossip broadcast queue: microseconds per operation", rows,
                  notes="push_take_us: one fresh rumour pushed and one piggyback taken; "
                        "take_us: one piggyback taken.")


if __name__ == "__main__":
    main()
