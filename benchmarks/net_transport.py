"""Peer transport throughput on loopback: TlsTransport requests (direct and through a relay),
datagrams and streamed bodies, against aiohttp HTTP/1.1 (plaintext) on the same machine.

    .venv/bin/python benchmarks/net_transport.py --seconds 3 --json artifacts/net_transport.json

Every scenario runs for a bounded time in one process (client and servers share the loop and
the CPU, as in the architecture doc's libp2p comparison); compare the ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import write_results
from aiohttp import web

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, PeerRequest, TlsTransport, TransportConfig

BODY = b"x" * 256


async def closed_loop(call: Any, concurrency: int, seconds: float) -> float:
    done = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            await call()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


async def bench_aiohttp(concurrency: int, seconds: float) -> float:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def call() -> None:
            async with http.post(f"http://127.0.0.1:{port}/echo", data=BODY) as r:
                await r.read()

        rate = await closed_loop(call, concurrency, seconds)
    await runner.cleanup()
    return rate


async def echo_handler(req: PeerRequest) -> HandlerResponse:
    return HandlerResponse(200, (), await req.read())


async def bench_transport(concurrency: int, seconds: float, stream_mb: int) -> dict[str, float]:
    adm = PskAdmission("bench", b"b" * 32)
    relay = TlsTransport(NodeKey.generate(), adm, TransportConfig(relay=True))
    server = TlsTransport(NodeKey.generate(), adm, TransportConfig(host=None))
    client = TlsTransport(NodeKey.generate(), adm)
    got = 0

    def on_msg(peer: str, payload: bytes) -> None:
        nonlocal got
        got += 1

    out: dict[str, float] = {}
    async with relay, server, client:
        server.set_request_handler(echo_handler)
        server.set_handler(on_msg)
        rid = await server.connect_bootstrap(relay.listen_addr)
        server.use_relays([rid])
        await server.wait_relayed(1)
        client.add_peer(rid, relay.advertised_addrs)
        client.add_peer(server.local_id, [], [rid])

        async def call() -> None:
            resp = await client.request(server.local_id, "POST", "/echo", (), BODY)
            await resp.read()
            await resp.aclose()

        out["relayed_req_s"] = await closed_loop(call, concurrency, seconds)
        # Direct: the server dials the client, so requests flow over that connection.
        await server.connect(client.listen_addr or "", expected_peer=client.local_id)
        out["direct_req_s"] = await closed_loop(call, concurrency, seconds)

        chunk = b"y" * 65536

        async def body() -> Any:
            for _ in range(stream_mb * 16):
                yield chunk

        t0 = time.perf_counter()
        resp = await client.request(server.local_id, "PUT", "/echo", (), body(), timeout=120)
        n = sum([len(c) async for c in resp.iter_chunks()])
        await resp.aclose()
        out["direct_stream_MB_s"] = n / (time.perf_counter() - t0) / 1e6

        n_msgs = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            for _ in range(200):
                client.send(server.local_id, BODY)
                n_msgs += 1
            await asyncio.sleep(0)
        async with asyncio.timeout(30):
            while got + sum(client.stats.dropped.values()) < n_msgs:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        # CPU of this process (sender and receiver both) per datagram sent.
        out["datagram_cpu_us"] = (time.process_time() - cpu0) / n_msgs * 1e6
        out["datagrams_s"] = got / elapsed
        out["datagram_drop_ratio"] = 1.0 - got / n_msgs
    return out


async def amain(args: argparse.Namespace) -> None:
    base = await bench_aiohttp(args.concurrency, args.seconds)
    res = await bench_transport(args.concurrency, args.seconds, args.stream_mb)
    rows = [
        {
            "scenario": "aiohttp HTTP/1.1 plaintext, echo 256 B",
            "rate": base,
            "unit": "req/s",
            "vs_aiohttp": 1.0,
        },
        {
            "scenario": "TlsTransport direct (TLS 1.3 + h2), echo 256 B",
            "rate": res["direct_req_s"],
            "unit": "req/s",
            "vs_aiohttp": res["direct_req_s"] / base,
        },
        {
            "scenario": "TlsTransport via relay, echo 256 B",
            "rate": res["relayed_req_s"],
            "unit": "req/s",
            "vs_aiohttp": res["relayed_req_s"] / base,
        },
        {
            "scenario": f"TlsTransport direct stream {args.stream_mb} MB echo",
            "rate": res["direct_stream_MB_s"],
            "unit": "MB/s",
            "vs_aiohttp": "",
        },
        {
            "scenario": "datagrams 256 B (send -> handler)",
            "rate": res["datagrams_s"],
            "unit": "msg/s",
            "vs_aiohttp": "",
        },
        {
            "scenario": "CPU per datagram 256 B (sender + receiver)",
            "rate": res["datagram_cpu_us"],
            "unit": "us",
            "vs_aiohttp": "",
        },
    ]
    payload = {
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "aiohttp_req_s": base,
        **res,
    }
    notes = (
        f"One process, loopback, {args.concurrency} requests in flight, "
        f"{args.seconds}s per scenario. Datagram drop ratio: "
        f"{res['datagram_drop_ratio']:.3f}."
    )
    write_results(args.json, payload, "Peer transport on loopback", rows, notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--stream-mb", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    main()
