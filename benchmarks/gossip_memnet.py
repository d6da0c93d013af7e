"""Protocol-level gossip numbers on virtual time: N agents on the in-memory network.

Unlike gossip_convergence.py / failure_detection.py (real nodes, real sockets), this isolates
the protocol from CPU and socket costs: one FakeClock, a loopback-like delay per message, the
same GossipAgent code. Per preset it reports, in virtual time: join propagation (p50/p95/p100
ms until each other replica has a new session), kill -9 detection (median s until no live
node lists the victim as routable), eviction time, and idle bytes per node per second.

    python benchmarks/gossip_memnet.py --nodes 128 --json benchmarks/results/gossip_memnet.json
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


async def one_preset(preset: str, n: int, trials: int, seed: int) -> dict[str, Any]:
    clock = FakeClock()
    net = MemNet(clock, seed=seed, delay=(0.0002, 0.001))
    cfg = PRESETS[preset]
    agents: list[GossipAgent] = []
    rng = random.Random(seed)

    async def add() -> GossipAgent:
        key = NodeKey.generate()
        a = GossipAgent(net.transport(key.peer_id), clock, key,
                        NodeMeta(models=(ServedModel("m"),)), config=cfg,
                        seeds=[agents[0].peer_id] if agents else [],
                        rng=random.Random(rng.random()))
        await a.start()
        a.set_state(Lifecycle.SERVING)
        agents.append(a)
        return a

    for _ in range(n - 1):
        await add()
        await clock.advance(0.01)
    ok = await clock.run_until(lambda: len({a.replica.root() for a in agents}) == 1, within=60)
    await clock.advance(5.0)
    # idle traffic
    b0 = sum(net.bytes_sent.values())
    await clock.advance(20.0)
    idle = (sum(net.bytes_sent.values()) - b0) / len(agents) / 20.0
    # join propagation
    seen: dict[str, float] = {}
    t0 = clock.now()
    newcomer_holder: list[GossipAgent] = []

    def watch(a: GossipAgent) -> None:
        def cb(change: Any) -> None:
            if newcomer_holder and change.session_id == newcomer_holder[0].session_id:
                seen.setdefault(a.peer_id, clock.now())
        a.add_listener(cb)

    for a in agents:
        watch(a)
    newcomer_holder.append(await add())
    await clock.run_until(lambda: len(seen) >= len(agents) - 1, within=10, step=0.002)
    join_ms = [(t - t0) * 1000 for t in seen.values()]
    # kill -9 detection
    detect, evict = [], []
    for _ in range(trials):
        live = [a for a in agents if a._running]
        victim = rng.choice(live[1:])
        others = [a for a in live if a is not victim]
        net.kill(victim.peer_id)
        await victim.aclose()
        t0 = clock.now()

        def gone(v: GossipAgent = victim, os: list[GossipAgent] = others) -> bool:
            return all(v.session_id not in {x.session_id for x in o.nodes.routable()} for o in os)

        await clock.run_until(gone, within=30, step=0.01)
        detect.append(clock.now() - t0)

        def left(v: GossipAgent = victim, os: list[GossipAgent] = others) -> bool:
            return all((x := o.nodes.get(v.session_id)) is None
                       or x.state is Lifecycle.LEFT for o in os)

        await clock.run_until(left, within=120, step=0.05)
        evict.append(clock.now() - t0)
        await clock.advance(2.0)
    false_evictions = sum(1 for a in agents if a._running and a.evicted)
    for a in agents:
        await a.aclose()
    await net.aclose()
    return {
        "preset": preset, "nodes": len(agents), "converged": ok,
        "join_p50_ms": pct(join_ms, 0.5), "join_p95_ms": pct(join_ms, 0.95),
        "join_p100_ms": max(join_ms) if join_ms else float("nan"),
        "join_reached": len(join_ms),
        "detect_median_s": statistics.median(detect), "evict_median_s": statistics.median(evict),
        "idle_bytes_per_node_s": idle, "false_evictions": false_evictions,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--presets", default="local,lan")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    rows = []
    for p in args.presets.split(","):
        t = time.monotonic()
        row = asyncio.run(one_preset(p, args.nodes, args.trials, args.seed))
        row["real_s"] = round(time.monotonic() - t, 1)
        rows.append(row)
        print(row, file=sys.stderr)
    write_results(args.json, {"nodes": args.nodes, "rows": rows},
                  "Gossip protocol on virtual time (in-memory network)",
                  rows, notes="Virtual time; per-message delay U(0.2, 1) ms; no CPU cost. "
                  "Targets: join p95 <= 200 ms, p100 <= 1 s; detection median <= 2 s; "
                  "idle <= 1 KB/s per node.")


if __name__ == "__main__":
    main()
