"""The provider side of the direct path when its ingress goes away mid-request: the pinned
HTTPS listener (node/serve/dataplane_server.py) in front of a real EngineProxy and a real
engine stand-in on loopback. The connection is lost while the engine is paused (a long
prefill, a queue): the engine request is closed at once, not at the next token the provider
would write, and a non-streamed answer is not generated for nobody.

The dead-peer detection that turns a vanished ingress (no FIN, no RST) into such a lost
connection is tests/unit/node/test_dataplane_keepalive.py (the options) and
tests/e2e/test_dead_ingress.py (iptables DROP in network namespaces)."""

from __future__ import annotations

import asyncio
import ssl
import time

import orjson
import pytest
from aiohttp import web

from llmfabric.dataplane.authz import AUTH_HEADER, authorize
from llmfabric.dataplane.exchange import answer, finish, offer
from llmfabric.forward.engine_proxy import EngineProxy
from llmfabric.identity import NodeKey
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.testing.poll import wait_until

pytestmark = [pytest.mark.integration]

PATH = FORWARD_PREFIX + "/v1/chat/completions"


class PausedEngine:
    """An engine on loopback that answers the first piece of a stream (or nothing, for a
    non-streamed request) and then pauses; it records a request whose connection is closed."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        stream = orjson.loads(await request.read()).get("stream", False)
        self.started.set()
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write(b'data: {"piece": 1}\n\n')
            await asyncio.sleep(3600)  # (paused: only a closed connection ends it)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        # (handler_cancellation: the request's connection closing is what cancels it)
        runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class ProxiedEngine:
    """Stands in for the node's EngineLink: its HTTPS path is the real EngineProxy."""

    def __init__(self, proxy: EngineProxy) -> None:
        self.handle_http = proxy.handle


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def _post(
    dp: DataPlaneServer, ingress: NodeKey, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An authorized request to the HTTPS listener, as the ingress sends it."""
    sent = offer(ingress, dp.key.peer_id)
    reply, session = answer(dp.key, sent.message, time.time())
    dp.sessions.add(session)
    header, _ = authorize(finish(sent, reply, time.time()), PATH.encode(), body, time.time())
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", dp.https_port, ssl=_insecure(), server_hostname=""
    )
    writer.write(
        f"POST {PATH} HTTP/1.1\r\nHost: provider\r\nContent-Type: application/json\r\n"
        f"{AUTH_HEADER}: {header.decode()}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("stream", [True, False])
async def test_a_lost_connection_closes_the_paused_engine_request(stream: bool) -> None:
    engine = PausedEngine()
    runner, base = await engine.serve()
    proxy = EngineProxy(base)
    dp = DataPlaneServer(
        NodeKey.generate(),
        lambda: ProxiedEngine(proxy),  # type: ignore[arg-type,return-value]
        lambda _peer: False,
        max_body_bytes=1 << 20,
    )
    try:
        await dp.start_https("127.0.0.1", 0)
        body = orjson.dumps(
            {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        )
        reader, writer = await _post(dp, NodeKey.generate(), body)
        if stream:  # the ingress got the first piece ...
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"piece" in await asyncio.wait_for(reader.readuntil(b"\n\n"), 10)
        await asyncio.wait_for(engine.started.wait(), 10)
        assert dp.served["https"] == 1 and not engine.cancelled.is_set()
        # ... and the connection is lost (what keepalive makes of a vanished ingress)
        writer.transport.abort()
        # The engine request is closed although the engine had nothing to write (before,
        # it ran on until its next token, or to the end of a non-streamed answer).
        await wait_until(engine.cancelled.is_set, 10, "the engine request closed")
    finally:
        await dp.aclose()
        await proxy.aclose()
        await runner.cleanup()
