"""Prefill/decode disaggregation through the real ingress (issue 14): what the two-phase path
costs and what 4-bit KV saves, on loopback, in ONE run.

    python benchmarks/pd_fabric.py --json OUT.json [--requests 48] [--concurrency 8]

Four simulated engines (llama-3.1-8b timing on A40, real time) behind one in-process ingress
(aiohttp app, HTTP forwarder, static candidates), in three layouts: 4 colocated engines; 2
prefill + 2 decode with fp16 KV; the same with 4-bit KV. The KV link is 40 Gbit/s x 0.6
(ThunderServe's effective 3 GB/s) with 1 ms latency. A closed loop of `--concurrency` clients
streams `--requests` chat requests (~1000-token prompts, 32 tokens, ignore_eos) per layout
and measures TTFT, TPOT and E2E at the client. The simulated engine models no prefill/decode
interference (its decode loop runs beside queued prefills), so disaggregation cannot win
here: the run measures the handoff's price (an extra hop + the eq.-1 KV time) and 4-bit's cut
of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pct, write_results

from llmfabric.engines.pd_role import KVLink, kv_bytes
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.forward import HttpForwarder
from llmfabric.front.web_app import build_ingress_app
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.registry.records import Hardware, LoadHints, ModelRole, ServedModel
from llmfabric.routing.candidates import Candidate

MODEL, GPU = "llama-3.1-8b", "A40"
LINK = KVLink(gbps=40 * 0.6, latency_s=0.001)
PROMPT = " ".join(f"word{i % 97}" for i in range(700))  # ~1000 tokens by the sim's count


async def _site(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"127.0.0.1:{port}"


async def _one(session: aiohttp.ClientSession, url: str, i: int) -> dict[str, float]:
    body = {"model": MODEL, "stream": True, "max_tokens": 32, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{i} {PROMPT}"}]}
    t0 = time.perf_counter()
    first = last = 0.0
    n = 0
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"' in line and \
                    b'"content":""' not in line:
                last = time.perf_counter()
                first = first or last
                n += 1
    return {"ttft": first - t0, "e2e": last - t0, "tpot": (last - first) / max(1, n - 1)}


async def layout(name: str, roles: list[str], kv_bits: int | None, n: int, conc: int
                 ) -> dict[str, Any]:
    engines = [SimEngine(SimEngineConfig(models=(MODEL,), gpu=GPU, role=r, kv_bits=kv_bits,
                                         kv_link=LINK)) for r in roles]
    runners, cands = [], []
    for i, (eng, role) in enumerate(zip(engines, roles, strict=True)):
        runner, addr = await _site(eng.app())
        runners.append(runner)
        cands.append(Candidate(f"e{i}", "", "bench", addr, (), Hardware(GPU, 1),
                               ServedModel(MODEL, role=ModelRole(role)), LoadHints()))
    app = build_ingress_app(IngressConfig(auth_enabled=False, policy="least_outstanding"),
                            StaticCandidateSource(cands), HttpForwarder())
    runner, addr = await _site(app)
    runners.append(runner)
    url = f"http://{addr}/v1/chat/completions"
    results: list[dict[str, float]] = []
    queue = iter(range(n))
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as s:
        await _one(s, url, -1)  # warm-up

        async def worker() -> None:
            for i in queue:
                results.append(await _one(s, url, i))

        await asyncio.gather(*(worker() for _ in range(conc)))
    wall = time.perf_counter() - t0
    pd_stats = [e.pd.stats() for e in engines]
    for r in runners:
        await r.cleanup()
    for e in engines:
        for b in e.batchers.values():
            await b.aclose()
    col = {k: [r[k] for r in results] for k in ("ttft", "tpot", "e2e")}
    return {
        "layout": name, "requests": n,
        "ttft_p50_ms": 1e3 * pct(col["ttft"], 0.5), "ttft_p90_ms": 1e3 * pct(col["ttft"], 0.9),
        "tpot_p50_ms": 1e3 * pct(col["tpot"], 0.5), "e2e_p50_ms": 1e3 * pct(col["e2e"], 0.5),
        "req_per_s": n / wall,
        "kv_mb_per_req": sum(p["kv_bytes_in"] for p in pd_stats) / 1e6 / max(1, n),
        "kv_ms_per_req": 1e3 * sum(p["kv_transfer_s"] for p in pd_stats) / max(1, n),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name, roles, bits in (
            ("colocated 4 both", ["both"] * 4, None),
            ("PD 2P+2D, fp16 KV", ["prefill", "prefill", "decode", "decode"], None),
            ("PD 2P+2D, 4-bit KV", ["prefill", "prefill", "decode", "decode"], 4)):
        rows.append(await layout(name, roles, bits, args.requests, args.concurrency))
        print(rows[-1], flush=True)
    tokens = 1000
    return {"rows": rows, "link_gbps": LINK.gbps, "load_avg": os.getloadavg(),
            "eq1_ms_fp16": 1e3 * LINK.transfer_s(kv_bytes(MODEL, tokens, None)),
            "eq1_ms_4bit": 1e3 * LINK.transfer_s(kv_bytes(MODEL, tokens, 4))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    out = asyncio.run(asyncio.wait_for(main_async(args), 170))
    write_results(args.json, out, "PD through the fabric (issue 14)", out["rows"],
                  f"load average {out['load_avg']}; eq. 1 for 1000 tokens: "
                  f"{out['eq1_ms_fp16']:.1f} ms fp16, {out['eq1_ms_4bit']:.1f} ms 4-bit")


if __name__ == "__main__":
    _ = orjson  # (the ingress's JSON library; imported for the same import cost)
    main()
