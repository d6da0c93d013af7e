"""Fair queueing under a flood, and what tracing costs the ingress.

    python benchmarks/fair_tenancy.py [--json OUT.json] [--light 30] [--flood 64]

Part 1 (fairness): one ingress (the lean front) in front of an engine that serves at most
`--engine-slots` streams at once (a saturated GPU: the rest wait in its FIFO). Tenant
"light" sends `--light` sequential streaming requests; tenant "flood" keeps `--flood`
requests in flight. Light's TTFT (first byte at the client) is measured alone, under the
flood with no fair queue, and under the flood with the ingress's fair queue at the engine's
capacity (--max-inflight = engine slots). Goal (issue 17): light's p99 TTFT under the flood
within 2x of its unloaded value. The engine and the flood's clients run in child
processes; the ingress and the light client share this one.

Part 2 (tracing cost): closed-loop non-streaming requests through the lean front to a fast
engine, with tracing off (keep_traces=0) and on (the default ring, no exporter),
alternating rounds in one process. Writes JSON + markdown (OUT.md), or prints them.
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

sys.path.insert(0, str(Path(__file__).parent))
from _common import pct, write_results

from llmfabric.accounts.fairqueue import FairQueue
from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.tenancy.accounts_auth import StaticKeys
from llmfabric.tenancy.gate import TenancyGate

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 8}


def engine_app(slots: int, prefill_s: float, tokens: int, token_s: float) -> web.Application:
    sem = asyncio.Semaphore(slots)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        async with sem:
            if not body.get("stream"):
                return web.json_response({"id": "x", "object": "chat.completion", "model": "m",
                                          "choices": [{"index": 0, "message": {
                                              "role": "assistant", "content": "ok"}}],
                                          "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                    "total_tokens": 4}})
            await asyncio.sleep(prefill_s)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(tokens):
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m",
                         "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(token_s)
            await resp.write(b"data: [DONE]\n\n")
            return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def start_engine(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def start_front(engine_port: int, gate_slots: int | None, keep_traces: int = 200
                      ) -> tuple[FastFront, int, Ingress]:
    cand = Candidate("e1", "peer-e1", "p", f"127.0.0.1:{engine_port}", (), Hardware("H100", 1),
                     ServedModel("m"), LoadHints())
    keys = StaticKeys({"light-key": "light", "flood-key": "flood"})
    ingress = Ingress(IngressConfig(keep_traces=keep_traces,
                                    timeouts=IngressConfig().timeouts),
                      StaticCandidateSource([cand]), HttpForwarder(), auth=keys, usage_sink=keys)
    if gate_slots is not None:
        ingress.use_gate(TenancyGate(None, FairQueue(gate_slots, max_waiting_per_owner=4096,
                                                     max_wait_s=300, now=time.monotonic)))
    front = FastFront(ingress)
    port = await front.start("127.0.0.1", 0)
    return front, port, ingress


async def ttft(http: aiohttp.ClientSession, url: str, key: str) -> float:
    t0 = time.perf_counter()
    async with http.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, await r.text()
        await r.content.readany()
        first = time.perf_counter() - t0
        await r.read()
    return first


async def flood_process(url: str, n: int, seconds: float) -> None:
    """Child process: keep `n` flood streams in flight for `seconds`; print requests done."""
    done = 0
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await ttft(http, url, "flood-key")
                done += 1

        await asyncio.gather(*(one() for _ in range(n)))
    print(done, flush=True)


async def serve_engine_process(slots: int) -> None:
    """Child process: the engine on a free port (printed), until stdin closes."""
    runner, port = await start_engine(engine_app(slots, 0.02, 8, 0.002))
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


async def child(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, *argv, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)


async def fairness_case(engine_port: int, gate: int | None, light: int, flood: int
                        ) -> dict[str, Any]:
    front, port, _ = await start_front(engine_port, gate)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    proc = None
    window = 2.0 + light * 1.0  # the flood outlasts the light requests
    if flood:
        proc = await child("--flood-child", url, str(flood), str(window))
        await asyncio.sleep(1.5)  # let the flood fill every queue
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter()
        xs = []
        for _ in range(light):
            xs.append(await ttft(http, url, "light-key"))
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - t0
    flood_rps = 0.0
    if proc is not None:
        out, _ = await proc.communicate()
        flood_rps = int(out.split()[-1]) / window
    await front.aclose()
    return {"p50_ttft_ms": pct(xs, 0.5) * 1000, "p99_ttft_ms": pct(xs, 0.99) * 1000,
            "mean_ttft_ms": sum(xs) / len(xs) * 1000, "flood_rps": flood_rps,
            "light_s": elapsed}


async def tracing_round(engine_port: int, keep: int, seconds: float, conc: int) -> float:
    front, port, _ = await start_front(engine_port, None, keep_traces=keep)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {**BODY, "stream": False}
    done = 0
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < end:
                async with http.post(url, json=body,
                                     headers={"Authorization": "Bearer light-key"}) as r:
                    await r.read()
                    done += r.status == 200

        await asyncio.gather(*(loop() for _ in range(conc)))
    await front.aclose()
    return done / seconds


async def main(args: argparse.Namespace) -> None:
    eng = await child("--engine-child", str(args.engine_slots))
    assert eng.stdout is not None and eng.stdin is not None
    eport = int(await eng.stdout.readline())
    rows = []
    cases = [("light alone", None, 0), ("flood, no fair queue", None, args.flood),
             ("flood, fair queue", args.engine_slots, args.flood)]
    for name, gate, flood in cases:
        r = await fairness_case(eport, gate, args.light, flood)
        rows.append({"case": name, **r})
    eng.stdin.close()
    await eng.wait()
    base = rows[0]["p99_ttft_ms"]
    for r in rows:
        r["p99_vs_alone"] = r["p99_ttft_ms"] / base
    fast_runner, fport = await start_engine(engine_app(10_000, 0, 1, 0))
    trace_rows: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for label, keep in (("off", 0), ("on", 200)):
            trace_rows[label].append(await tracing_round(fport, keep, args.seconds, 16))
    await fast_runner.cleanup()
    tracing = {k: sorted(v)[len(v) // 2] for k, v in trace_rows.items()}
    load = os.getloadavg()
    payload = {"fairness": rows, "tracing_rps_median": tracing, "tracing_rounds": trace_rows,
               "loadavg": load, "args": {k: str(v) for k, v in vars(args).items()}}
    notes = (f"Engine: {args.engine_slots} slots, 20 ms prefill, 8 tokens x 2 ms. Light: "
             f"{args.light} sequential streams; flood: {args.flood} in flight. loadavg "
             f"{load[0]:.2f}. Tracing (non-streaming, 16 clients, median of {args.rounds} "
             f"rounds of {args.seconds} s): off {tracing['off']:.0f} req/s, on "
             f"{tracing['on']:.0f} req/s.")
    write_results(args.json, payload, "Fair queueing under a flood; tracing cost", rows,
                  notes, ["case", "p50_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
                          "p99_vs_alone", "flood_rps"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood-child"]:
        asyncio.run(flood_process(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
        sys.exit(0)
    if sys.argv[1:2] == ["--engine-child"]:
        asyncio.run(serve_engine_process(int(sys.argv[2])))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--light", type=int, default=30)
    ap.add_argument("--flood", type=int, default=64)
    ap.add_argument("--engine-slots", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    asyncio.run(main(ap.parse_args()))
