"""The direct data-plane path when the provider refuses with 401 (it may have lost our session):
the refusal's connection is closed whatever happens while its body is read (a cancelled
request left it open before: an unclosed TLS connection per cancel on a long-running ingress),
and a hostile node's endless refusal body is cut instead of read into memory."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from llmfabric.forward.raw import RawHttpForwarder, RawUpstream
from llmfabric.forward.secure import DataPlaneSessions, PinnedHttpsForwarder
from llmfabric.identity import NodeKey
from llmfabric.identity.certs import make_self_signed_cert
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.handshake import client_ssl_context, server_ssl_context

from .test_dataplane import PATH, EchoEngine, _provider, adm, cand

pytestmark = [
    pytest.mark.integration,
    pytest.mark.hostile,
    pytest.mark.filterwarnings("error::ResourceWarning"),
]

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
T = Timeouts(connect=5, first_byte=5, idle=30, total=60)


class HandsOver(RawHttpForwarder):
    """A real forwarder that says when a response head came and its upstream was handed on
    (the caller then runs on into reading the body before this event's waiter wakes)."""

    def __init__(self) -> None:
        super().__init__(FORWARD_PREFIX, ssl=client_ssl_context())
        self.handed = asyncio.Event()

    async def open_to(self, *args: Any, **kwargs: Any) -> RawUpstream:
        up = await super().open_to(*args, **kwargs)
        self.handed.set()
        return up


async def _refusing_node(body_len: int, sent: bytes) -> tuple[Any, asyncio.Future[bytes]]:
    """Starts a TLS listener (with the provider's key, set up by the caller) that answers 401
    announcing `body_len` bytes, sends `sent`, then waits; the future gets what the client
    sent after its request head (b"" at EOF: the client closed the connection)."""
    loop = asyncio.get_running_loop()
    after: asyncio.Future[bytes] = loop.create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(len(BODY))  # the request body
            writer.write(
                b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % body_len + sent
            )
            await writer.drain()
            got = await reader.read(1)
        except (ConnectionError, asyncio.IncompleteReadError):
            got = b""
        if not after.done():
            after.set_result(got)
        writer.close()

    return serve, after


async def _start(serve: Any, key: NodeKey) -> asyncio.Server:
    ctx = server_ssl_context(key, make_self_signed_cert(key))
    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)


async def test_a_cancel_while_reading_a_refusal_closes_its_connection() -> None:
    prov, dp = await _provider(EchoEngine(), set())
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    serve, after = await _refusing_node(1000, b'{"error": "unknown_session", ')
    server = await _start(serve, dp.key)
    dp.https_port = server.sockets[0].getsockname()[1]  # the exchange names this listener
    raw = HandsOver()
    fwd = PinnedHttpsForwarder(DataPlaneSessions(ing_key, ing), raw)
    try:
        async with prov, ing:
            await ing.connect_bootstrap(prov.listen_addr)
            task = asyncio.create_task(fwd.open(cand(prov.local_id, "127.0.0.1:1"), PATH, BODY, T))
            await raw.handed.wait()  # the forwarder now waits on the rest of the 401 body
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The node sees the connection end (before the fix it stayed open for good).
            assert await asyncio.wait_for(after, 20) == b""
    finally:
        await fwd.aclose()
        server.close()
        await server.wait_closed()


async def test_an_endless_refusal_body_is_cut() -> None:
    prov, dp = await _provider(EchoEngine(), set())
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    big = b"u" * (1 << 20)  # more than the forwarder reads of a refusal
    serve, after = await _refusing_node(len(big), big)
    server = await _start(serve, dp.key)
    dp.https_port = server.sockets[0].getsockname()[1]
    fwd = PinnedHttpsForwarder(DataPlaneSessions(ing_key, ing), HandsOver())
    try:
        async with prov, ing:
            await ing.connect_bootstrap(prov.listen_addr)
            with pytest.raises(UpstreamError, match="larger than"):
                await fwd.open(cand(prov.local_id, "127.0.0.1:1"), PATH, BODY, T)
            assert await asyncio.wait_for(after, 20) == b""
    finally:
        await fwd.aclose()
        server.close()
        await server.wait_closed()
