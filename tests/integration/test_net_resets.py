"""Stream resets and connection loss must not leave futures or tasks whose exception nobody
retrieves (asyncio logs "Future exception was never retrieved" for those when they are
collected). The loop's exception handler records every such report and the test fails on any."""

import asyncio
import gc
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, RequestFailed, TlsTransport
from llmfabric.net.addressbook import parse_addr
from llmfabric.net.framing import FrameType, encode_frame

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Every report that reaches the running loop's exception handler."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    yield seen
    loop.set_exception_handler(old)


async def _collect(seen: list[dict[str, Any]]) -> list[str]:
    for _ in range(3):  # let callbacks run, then collect what became garbage
        await asyncio.sleep(0.05)
        gc.collect()
    await asyncio.sleep(0)
    return [str(ctx.get("message")) + " " + repr(ctx.get("exception")) for ctx in seen]


async def test_resets_and_closed_connections_leave_no_unretrieved_exceptions(loop_errors):
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    never = asyncio.Event()
    started = asyncio.Event()

    async def serve(req):
        if req.path == "/stuck":
            started.set()
            await never.wait()
        if req.path == "/upload":
            await req.read()
        return HandlerResponse(200, (), b"x" * 200_000)

    async def failing_body():
        yield b"part"
        raise RuntimeError("the caller's body generator failed")

    async with a, b:
        b.set_request_handler(serve)
        await a.connect_bootstrap(b.listen_addr)
        # 1. The caller times out: its reset (CANCEL, code 8) reaches a busy handler.
        for _ in range(5):
            with pytest.raises(RequestFailed, match="within"):
                await a.request(b.local_id, "GET", "/stuck", timeout=0.1)
        # 2. The caller closes a response early (reset while the server streams its body).
        for _ in range(5):
            resp = await a.request(b.local_id, "GET", "/big")
            await resp.aclose()
        # 3. The caller's request body fails halfway.
        with pytest.raises(RequestFailed):
            resp = await a.request(b.local_id, "POST", "/upload", (), failing_body(), timeout=1)
            await resp.read()
        # 4. The connection dies with requests in flight on both sessions.
        started.clear()
        pending = asyncio.ensure_future(a.request(b.local_id, "GET", "/stuck", timeout=5))
        await asyncio.wait_for(started.wait(), 5)
        conn = b.connection(a.local_id)
        assert conn is not None
        await conn.aclose()
        with pytest.raises(RequestFailed):
            await pending
    reports = await _collect(loop_errors)
    assert not [r for r in reports if "never retrieved" in r], reports


async def test_closing_while_refusing_a_connection_reports_nothing_to_the_loop(loop_errors):
    a = TlsTransport(NodeKey.generate(), psk())
    await a.start()
    host, port = parse_addr(a.listen_addr or "")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    try:
        writer.write(encode_frame(FrameType.AUTH, b"\xc1garbled"))
        await writer.drain()
        writer.transport.pause_reading()  # never answer the server's TLS close
        # The server refuses and waits (up to 1 s) for a TLS close this client never sends;
        # closing the transport now cancels that wait.
        async with asyncio.timeout(5):
            while not a.stats.handshakes_refused["garbled"]:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        await a.aclose()
    finally:
        writer.transport.abort()
    reports = await _collect(loop_errors)
    assert not reports, reports
