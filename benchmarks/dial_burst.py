"""A burst of concurrent requests from a fresh ingress forwarder to one provider's data-plane
HTTPS listener: with the forwarder's dial gate (`RawHttpForwarder(max_dials_per_node=...)`)
at its default and effectively off, against a provider with its caps on connections
mid-handshake (256 in all, 128 per address) and without them (`before`: neither).

    .venv/bin/python benchmarks/dial_burst.py --requests 200 --repeat 3 --json artifacts/burst.json

The provider runs in a child process with an engine stand-in that answers at once. The
parent opens a `PinnedHttpsForwarder` with no pooled connection (the session exchange done
beforehand) and sends `--requests` requests at the same moment: a load spike on a provider
no request went to yet. Reported per run: wall time of the burst, p50 / p99 request latency,
failed requests and the provider's refusals at its cap.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
from _common import pct, write_results

PATH = "/v1/chat/completions"
# name: (the forwarder's max dials per node, the provider's caps on) ; "before": this stop's
# starting point, neither the gate nor the provider's caps
VARIANTS = {"gate 32 + caps (now)": (32, True), "no gate + caps": (1_000_000, True),
            "no gate, no caps (before)": (1_000_000, False)}


async def serve(capped: bool) -> None:
    """The child: a provider's peer transport + data plane; prints its peer address, then
    its busy refusals whenever asked (a line on stdin)."""
    from aiohttp import web

    from llmfabric.identity import NodeKey, PskAdmission
    from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
    from llmfabric.node.serve.dataplane_server import DataPlaneServer
    from llmfabric.node.serve.peer_api import PeerApi

    class Echo:
        async def handle_http(self, request: web.Request) -> web.StreamResponse:
            return web.Response(body=await request.read(), content_type="application/json")

    async def unused(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(404, (), b"")

    key = NodeKey.generate()
    t = TlsTransport(key, PskAdmission("burst", b"b" * 32), TransportConfig())
    caps = {} if capped else {"max_handshakes": None, "max_handshakes_per_ip": None}
    dp = DataPlaneServer(key, lambda: Echo(), lambda _p: False,  # type: ignore[arg-type,return-value]
                         max_body_bytes=1 << 20, **caps)
    t.set_request_handler(PeerApi(dp, unused).handle)
    async with t:
        await dp.start_https("127.0.0.1", 0)
        print(t.listen_addr, t.local_id, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            print(dp.refused.get("busy", 0), flush=True)
        await dp.aclose()


async def burst(addr: str, peer: str, n: int, max_dials: int) -> dict[str, float]:
    from llmfabric.forward.raw import RawHttpForwarder
    from llmfabric.forward.secure import DataPlaneSessions, PinnedHttpsForwarder
    from llmfabric.identity import NodeKey, PskAdmission
    from llmfabric.ingress.config import Timeouts
    from llmfabric.ingress.paths import FORWARD_PREFIX
    from llmfabric.net import TlsTransport, TransportConfig
    from llmfabric.net.handshake import client_ssl_context
    from llmfabric.registry.records import Hardware, LoadHints, ServedModel
    from llmfabric.routing.candidates import Candidate

    key = NodeKey.generate()
    timeouts = Timeouts(connect=10, first_byte=10, idle=10, total=30)
    async with TlsTransport(key, PskAdmission("burst", b"b" * 32),
                            TransportConfig(host=None)) as ing:
        await ing.connect_bootstrap(addr)
        raw = RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context(),
                               max_dials_per_node=max_dials)
        sessions = DataPlaneSessions(key, ing)
        fwd = PinnedHttpsForwarder(sessions, raw)
        cand = Candidate(session_id="s", peer_id=peer, provider_id="p", http_addr="127.0.0.1:1",
                         relays=(), hardware=Hardware(gpu_model="H100", gpu_count=1),
                         model=ServedModel("m"), load=LoadHints())
        latencies: list[float] = []
        failed = 0

        async def one(i: int) -> None:
            nonlocal failed
            started = time.perf_counter()
            try:
                up = await fwd.open(cand, PATH, orjson.dumps({"model": "m", "i": i}), timeouts)
                try:
                    await up.read()
                finally:
                    await up.aclose()
                latencies.append(time.perf_counter() - started)
            except Exception:  # counted: a refused or reset dial fails its request
                failed += 1

        # the session exchange once, so the burst measures dialling alone
        up = await fwd.open(cand, PATH, b"{}", timeouts)
        await up.aclose()
        await raw.aclose()
        raw = RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context(),
                               max_dials_per_node=max_dials)
        fwd = PinnedHttpsForwarder(sessions, raw)  # no pooled connection, session kept
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - started
        await raw.aclose()
    ms = [x * 1e3 for x in latencies]
    return {"wall_ms": wall * 1e3, "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99),
            "failed": failed}


async def amain(args: argparse.Namespace) -> None:
    rows = []
    for rep in range(args.repeat):
        for name, (dials, capped) in VARIANTS.items():
            child = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--serve", "1" if capped else "0", stdin=subprocess.PIPE,
                stdout=subprocess.PIPE)
            assert child.stdin is not None and child.stdout is not None
            addr, peer = (await child.stdout.readline()).decode().split()
            got = await burst(addr, peer, args.requests, dials)
            child.stdin.write(b"\n")
            await child.stdin.drain()
            got["provider_refused_busy"] = int(await child.stdout.readline())
            child.stdin.close()
            await child.wait()
            rows.append({"variant": name, "run": rep + 1, **got})
            print(f"{name} run {rep + 1}: {got}", file=sys.stderr)
    write_results(args.json, {"requests": args.requests, "load": os.getloadavg(), "rows": rows},
                  "A burst to a fresh provider, with and without the dial gate", rows,
                  notes=f"{args.requests} concurrent requests; load {os.getloadavg()}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2] == "1"))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
