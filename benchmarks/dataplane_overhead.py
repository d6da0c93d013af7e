"""What the encrypted data plane adds to the direct ingress -> provider hop, at concurrency 1.

    python benchmarks/dataplane_overhead.py --json OUT.json [--requests 2000] [--rounds 5]

One process, loopback, the real parts on both sides, a stand-in engine answering in-process
(so only the hop is measured): the same provider app served two ways, interleaved in rounds:
- `plain`: the previous direct path: HTTP, `RawHttpForwarder`, a static forward token
  compared with `hmac.compare_digest` (what main did before the data plane);
- `secure`: `PinnedHttpsForwarder` (TLS 1.3 pinned to the provider's node key, a fresh
  `X-Fabric-Auth` per request) -> `DataPlaneServer.handle_https` (HMAC check, replay cache).
Non-streamed requests (a ~300-byte chat answer) and streams (16 SSE chunks): p50/p99 latency
per request, the added p50 (secure - plain), and the micro-costs of one authorize/verify.
Writes JSON + a markdown table (OUT.md beside OUT.json).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from llmfabric.dataplane.authz import ProviderSessions, authorize
from llmfabric.dataplane.exchange import answer, finish, offer
from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.forward.secure import DataPlaneSessions, PinnedHttpsForwarder
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.handshake import client_ssl_context
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import PeerApi
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate

TOKEN = "f" * 64
T = Timeouts(5, 30, 30, 60)
ANSWER = orjson.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hello " * 20},
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 7, "completion_tokens": 20}})
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'


class Engine:
    """The provider's engine, answering in-process (no second hop)."""

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            return web.Response(body=ANSWER, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(16):
            await resp.write(CHUNK)
        await resp.write_eof()
        return resp


def body(stream: bool) -> bytes:
    return orjson.dumps({"model": "m", "stream": stream, "max_tokens": 16,
                         "messages": [{"role": "user", "content": "x " * 256}]})


async def plain_server(engine: Engine) -> tuple[web.AppRunner, int]:
    async def handle(request: web.Request) -> web.StreamResponse:
        got = request.headers.get("X-Fabric-Forward-Token", "")
        if not hmac.compare_digest(got.encode(), TOKEN.encode()):
            return web.Response(status=401)
        return await engine.handle_http(request)

    app = web.Application()
    app.router.add_post(FORWARD_PREFIX + "/v1/{tail:.+}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


async def timed(fwd: Any, cand: Candidate, n: int, stream: bool) -> list[float]:
    data = body(stream)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        up = await fwd.open(cand, "/v1/chat/completions", data, T)
        if stream:
            async for _c in up.chunks():
                pass
        else:
            await up.read()
        await up.aclose()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def micro() -> dict[str, float]:
    ing, prov = NodeKey.generate(), NodeKey.generate()
    sent = offer(ing, prov.peer_id)
    msg, ps = answer(prov, sent.message, time.time())
    s = finish(sent, msg, time.time())
    sessions = ProviderSessions()
    sessions.add(ps)
    data, path = body(False), b"/v1/fabric/forward/v1/chat/completions"
    n = 5000
    t0 = time.perf_counter()
    headers = [authorize(s, path, data, time.time())[0].decode() for _ in range(n)]
    t1 = time.perf_counter()
    for h in headers:
        sessions.verify(h, path, data, time.time())
    t2 = time.perf_counter()
    t3 = time.perf_counter()
    for _ in range(200):
        sent = offer(ing, prov.peer_id)
        msg, _ = answer(prov, sent.message, time.time())
        finish(sent, msg, time.time())
    t4 = time.perf_counter()
    return {"authorize_us": (t1 - t0) / n * 1e6, "verify_us": (t2 - t1) / n * 1e6,
            "session_exchange_cpu_us": (t4 - t3) / 200 * 1e6}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine()
    runner, plain_port = await plain_server(engine)
    pkey, ikey = NodeKey.generate(), NodeKey.generate()
    adm = PskAdmission("bench", b"b" * 32)
    prov = TlsTransport(pkey, adm, TransportConfig())
    ing = TlsTransport(ikey, adm, TransportConfig(host=None))
    dp = DataPlaneServer(pkey, lambda: engine, lambda _p: True,  # type: ignore[arg-type,return-value]
                         max_body_bytes=1 << 20)
    prov.set_request_handler(PeerApi(dp, lambda p, b: None).handle)  # type: ignore[arg-type,return-value]
    results: dict[str, dict[str, list[float]]] = {}
    async with prov, ing:
        await dp.start_https("127.0.0.1", 0)
        await ing.connect_bootstrap(prov.listen_addr or "")
        plain = RawHttpForwarder(FORWARD_PREFIX, extra_headers={"X-Fabric-Forward-Token": TOKEN})
        secure = PinnedHttpsForwarder(DataPlaneSessions(ikey, ing),
                                      RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context()))
        cand = {"plain": Candidate("s", "", "p", f"127.0.0.1:{plain_port}", (), Hardware(),
                                   ServedModel("m"), LoadHints()),
                "secure": Candidate("s", pkey.peer_id, "p", "127.0.0.1:1", (), Hardware(),
                                    ServedModel("m"), LoadHints())}
        fwd = {"plain": plain, "secure": secure}
        for name in fwd:  # warm up: pools, the session exchange, TLS handshakes
            await timed(fwd[name], cand[name], 50, False)
        for r in range(args.rounds):
            for stream in (False, True):
                for name in ("plain", "secure") if r % 2 == 0 else ("secure", "plain"):
                    key = f"{name}-{'stream' if stream else 'plain'}"
                    got = await timed(fwd[name], cand[name], args.requests // args.rounds,
                                      stream)
                    results.setdefault(key, {}).setdefault("all", []).extend(got)
        await plain.aclose()
        await secure.aclose()
        await dp.aclose()
    await runner.cleanup()
    out: dict[str, Any] = {"meta": {"requests": args.requests, "rounds": args.rounds,
                                    "loadavg": [round(x, 2) for x in __import__("os")
                                                .getloadavg()]}}
    for key, v in sorted(results.items()):
        xs = sorted(v["all"])
        out[key] = {"p50_ms": statistics.median(xs), "p99_ms": xs[int(len(xs) * 0.99) - 1]}
    for kind in ("plain", "stream"):
        out[f"added_p50_ms_{kind}"] = (out[f"secure-{kind}"]["p50_ms"]
                                       - out[f"plain-{kind}"]["p50_ms"])
    out["micro"] = micro()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=2000, help="per path and kind")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-uvloop", action="store_true",
                    help="plain asyncio (nodes use uvloop when it is installed)")
    args = ap.parse_args()
    loop_kind = "asyncio"
    if not args.no_uvloop:
        try:
            import uvloop

            uvloop.install()
            loop_kind = "uvloop"
        except ImportError:
            pass
    out = asyncio.run(run(args))
    out["meta"]["loop"] = loop_kind
    args.json.write_text(json.dumps(out, indent=2))
    rows = ["| path | request p50 (ms) | p99 (ms) |", "|---|---|---|"]
    for key in ("plain-plain", "secure-plain", "plain-stream", "secure-stream"):
        rows.append(f"| {key} | {out[key]['p50_ms']:.3f} | {out[key]['p99_ms']:.3f} |")
    m = out["micro"]
    rows.append("")
    rows.append(f"Added p50 by the data plane: {out['added_p50_ms_plain']:.3f} ms (plain "
                f"requests), {out['added_p50_ms_stream']:.3f} ms (16-chunk streams). "
                f"authorize {m['authorize_us']:.1f} us, verify {m['verify_us']:.1f} us, one "
                f"session exchange {m['session_exchange_cpu_us']:.0f} us CPU (both sides). "
                f"Load average {out['meta']['loadavg']}, {loop_kind}.")
    text = "\n".join(rows) + "\n"
    args.json.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
