"""Cache-aware routing on the Mooncake conversation trace over 8 simulated prefix-caching engines.

Replays `conversation_trace.jsonl` (shared data: timestamp ms, input/output length,
`hash_ids` one per 512-token block) open loop, time compressed by `--speed`, through one
ingress's routing policy (the real `llmfabric.routing` policies, fed Candidates and
RouteRequests as the ingress does) onto `--engines` `sim.prefix_cache.PrefixEngine`s:
llama-3.1-8b on one H100 each, prefill time from the simulator's roofline
(`sim.costs.prefill_time` of the uncached tokens), KV capacity from `sim.memory` as an LRU of
512-token blocks, decode beside prefill at the simulator's step time (it holds the request in
flight). Every policy sees the same arrivals, so throughput is equal.

Policies: random, round_robin, least_outstanding, prefix_affinity (the existing ring over the
first 512 prompt characters: here the first block id, which every request of this trace
shares), prefix_bounded (this ingress's memory of where it sent each block), session
(conversation = the first block after the shared system prompt), and cache_aware (gossiped
sketches only: each engine's Bloom sketch of its LRU's blocks, refreshed every `--gossip-s`
simulated seconds as records would be, and no memory of its own). The bounded policies use
eps = `--eps`.

Metrics: cache hit rate (prompt tokens served from the prefix cache), mean and p99 TTFT
(queue + prefill), `max_load`: the mean over arrivals of max/mean in-flight across engines
(arrivals with at least one in flight per engine on average), and `max_work`: the busiest
engine's prefill seconds over the mean.

    python benchmarks/routing_cache.py --json benchmarks/results/routing_cache.json
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import pathlib
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import pct, write_results

from llmfabric.registry.cache_sketch import MAX_SKETCH_BYTES, build_sketch
from llmfabric.registry.records import Hardware, NodeMeta, NodeRecord, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.policies import make_policy
from llmfabric.routing.prefix import CacheAwarePolicy, PrefixBoundedPolicy, SessionAffinityPolicy
from llmfabric.routing.request import RouteRequest
from llmfabric.sim.costs import decode_step_time, prefill_time
from llmfabric.sim.memory import max_kv_tokens
from llmfabric.sim.prefix_cache import Prefill, PrefixEngine

TRACE = pathlib.Path(os.environ.get("LLMFABRIC_DATA", "/work/shared/data")) / \
    "traces/conversation_trace.jsonl"
BLOCK_TOKENS = 512
MODEL, GPU = "llama-3.1-8b", "H100"
POLICY_NAMES = ("random", "round_robin", "least_outstanding", "prefix_affinity",
                "prefix_bounded", "session", "cache_aware")


def load_trace(path: pathlib.Path, limit: int) -> list[dict[str, Any]]:
    rows = []
    with path.open() as f:
        for line in f:
            rows.append(json.loads(line))
            if limit and len(rows) >= limit:
                break
    return rows


def candidates(n: int) -> list[Candidate]:
    model = ServedModel("m")
    out = []
    for i in range(n):
        rec = NodeRecord(f"e{i}", f"peer{i}", b"", 1, 0, 1, 0.0,  # type: ignore[arg-type]
                         NodeMeta(http_addr=f"10.0.0.{i}:8000", models=(model,),
                                  hardware=Hardware("H100-SXM", 1)))
        out.append(Candidate.from_record(rec, model))
    return out


def make(name: str, eps: float, seed: int) -> Any:
    rng = random.Random(seed)
    if name == "prefix_bounded":
        return PrefixBoundedPolicy(rng, eps=eps)
    if name == "session":
        return SessionAffinityPolicy(rng, eps=eps)
    if name == "cache_aware":
        return CacheAwarePolicy(rng, eps=eps, memory=0)  # sketches only
    return make_policy(name, rng)


def run_policy(name: str, trace: list[dict[str, Any]], args: argparse.Namespace,
               prefill_s: Any, tpot: float, kv_blocks: int) -> dict[str, Any]:
    cands = candidates(args.engines)
    index = {c.session_id: i for i, c in enumerate(cands)}
    engines = [PrefixEngine(kv_blocks, BLOCK_TOKENS, prefill_s) for _ in cands]
    policy = make(name, args.eps, args.seed)
    inflight = [0] * len(cands)
    ends: list[tuple[float, int, int]] = []  # (time, seq, engine)
    ttfts: list[float] = []
    ratios: list[float] = []
    next_gossip = 0.0
    t0 = trace[0]["timestamp"]
    for seq, row in enumerate(trace):
        now = (row["timestamp"] - t0) / 1000.0 / args.speed
        while ends and ends[0][0] <= now:
            _, _, e = heapq.heappop(ends)
            inflight[e] -= 1
            policy.on_request_end(cands[e], True)
        if name == "cache_aware" and now >= next_gossip:
            cands = [dataclasses.replace(c, prefix_cache=build_sketch(
                engines[i].cache.recent(args.sketch_keys), args.sketch_bytes))
                for i, c in enumerate(cands)]
            next_gossip = now + args.gossip_s
        ids = tuple(row["hash_ids"])
        keys = tuple((h * 0x9E3779B97F4A7C15 + 1) & (2**64 - 1) for h in ids)
        session = str(ids[1]) if len(ids) > 1 else str(ids[0])
        req = RouteRequest("m", prefix=str(ids[0]), blocks=keys, session=session, stream=True)
        cand = policy.pick(cands, req)
        e = index[cand.session_id]
        policy.on_request_start(cand)
        mean = sum(inflight) / len(inflight)
        if mean >= 1.0:
            ratios.append(max(inflight) / mean)
        inflight[e] += 1
        p = engines[e].submit(Prefill(seq, now, keys, row["input_length"]))
        ttfts.append(p.end - now)
        heapq.heappush(ends, (p.end + row["output_length"] * tpot, seq, e))
    hits = sum(x.hit_tokens for x in engines)
    prompts = sum(x.prompt_tokens for x in engines)
    busy = [x.busy_s for x in engines]
    return {
        "policy": name,
        "hit_rate": hits / prompts,
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_p99_s": pct(ttfts, 0.99),
        "max_load": statistics.fmean(ratios) if ratios else 1.0,
        "max_work": max(busy) / statistics.fmean(busy),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--trace", type=pathlib.Path, default=TRACE)
    ap.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--speed", type=float, default=3.0, help="trace time compression")
    ap.add_argument("--kv-blocks", type=int, default=0,
                    help="prefix-cache blocks per engine (0: the H100's KV capacity; more "
                         "models a CPU-offloaded cache)")
    ap.add_argument("--eps", type=float, default=0.25)
    ap.add_argument("--gossip-s", type=float, default=10.0)
    ap.add_argument("--sketch-bytes", type=int, default=MAX_SKETCH_BYTES)
    ap.add_argument("--sketch-keys", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    args = ap.parse_args()

    trace = load_trace(args.trace, args.requests)
    kv_blocks = args.kv_blocks or max_kv_tokens(MODEL, GPU) // BLOCK_TOKENS
    memo: dict[int, float] = {}

    def prefill_s(n: int) -> float:
        k = max(1, -(-n // 64) * 64)  # 64-token steps: the roofline is smooth
        if k not in memo:
            memo[k] = prefill_time(MODEL, GPU, 1, k)
        return memo[k]

    mean_ctx = statistics.fmean(r["input_length"] for r in trace)
    tpot = decode_step_time(MODEL, GPU, 1, 16, mean_ctx)
    t = time.perf_counter()
    rows = [run_policy(n, trace, args, prefill_s, tpot, kv_blocks)
            for n in args.policies.split(",")]
    base = next((r for r in rows if r["policy"] == "random"), rows[0])
    for r in rows:
        r["ttft_vs_random"] = r["ttft_mean_s"] / base["ttft_mean_s"]
    span = (trace[-1]["timestamp"] - trace[0]["timestamp"]) / 1000.0 / args.speed
    setup = {"requests": len(trace), "engines": args.engines, "speed": args.speed,
             "rate_rps": len(trace) / span if span else 0.0, "eps": args.eps,
             "kv_blocks_per_engine": kv_blocks, "tpot_s": tpot, "gossip_s": args.gossip_s,
             "sketch_bytes": args.sketch_bytes, "sketch_keys": args.sketch_keys,
             "model": MODEL, "gpu": GPU, "wall_s": time.perf_counter() - t,
             "loadavg": os.getloadavg()}
    notes = (f"{len(trace)} requests of the Mooncake conversation trace at "
             f"{setup['rate_rps']:.1f} req/s over {args.engines} engines ({MODEL} on {GPU}, "
             f"{kv_blocks} KV blocks of 512 tokens each), eps={args.eps}, "
             f"sketch {args.sketch_bytes} B refreshed every {args.gossip_s} s.")
    write_results(args.json, {"setup": setup, "rows": rows},
                  "Cache-aware routing on the Mooncake conversation trace", rows, notes,
                  ["policy", "hit_rate", "ttft_mean_s", "ttft_p99_s", "ttft_vs_random",
                   "max_load", "max_work"])


if __name__ == "__main__":
    main()
