"""A slow (CPU-starved) peer still answers: the TCP connect limit does not cover the TLS
handshake, the dial-back check reports failures as False with a reason, and a request that
crosses the peer's idle close is sent again instead of failing. Real sockets on loopback."""

import asyncio
import contextlib

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.net.addressbook import parse_addr

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        first = True
        while data := await src.read(65536):
            if first:  # a starved peer: its first answer comes late
                await asyncio.sleep(delay)
                first = False
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(Exception):
        dst.close()


@contextlib.asynccontextmanager
async def slow_proxy(target: str, delay: float):
    """A TCP proxy in front of `target` whose replies start `delay` seconds late."""
    host, port = parse_addr(target)
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(host, port)
        writers.extend((w, uw))
        for t in (_pipe(r, uw, 0.0), _pipe(ur, w, delay)):
            task = asyncio.ensure_future(t)
            tasks.add(task)

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for w in writers:
            w.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in writers:
            with contextlib.suppress(Exception):
                await w.wait_closed()
        await server.wait_closed()


async def test_a_peer_slower_than_the_connect_timeout_still_completes_the_handshake():
    cfg = TransportConfig(connect_timeout=0.2, handshake_timeout=5.0)
    a = TlsTransport(NodeKey.generate(), psk(), cfg)
    b = TlsTransport(NodeKey.generate(), psk())
    async with a, b, slow_proxy(b.listen_addr or "", delay=0.6) as slow_b:
        assert await a.connect(slow_b, expected_peer=b.local_id) == b.local_id


async def test_dial_back_failures_are_false_with_a_reason_never_exceptions():
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    async with a, b:
        ghost = NodeKey.generate().peer_id
        assert await a.check_reachability(ghost) is False  # used to raise PeerUnreachable
        res = await a.reachability(ghost)
        assert not res.ok and "dial-back request" in res.reason and ghost in res.reason
        bid = await a.connect_bootstrap(b.listen_addr)
        res = await a.reachability(bid, "127.0.0.1:1")
        assert not res.ok and "could not dial 127.0.0.1:1" in res.reason
        res = await a.reachability(bid)
        assert res.ok and a.listen_addr in res.reason


async def test_request_crossing_the_peers_idle_close_is_sent_again():
    a = TlsTransport(NodeKey.generate(), psk(), TransportConfig(idle_close_s=None))
    b = TlsTransport(NodeKey.generate(), psk(), TransportConfig(idle_close_s=None))
    served: list[str] = []

    async def serve(req):
        served.append(req.path)
        return HandlerResponse(200, (), b"ok")

    async with a, b:
        b.set_request_handler(serve)
        a.add_peer(b.local_id, [b.listen_addr])
        await a.connect(b.listen_addr, expected_peer=b.local_id)
        await asyncio.sleep(0.05)
        call = asyncio.ensure_future(a.request(b.local_id, "POST", "/once", (), b"body"))
        await asyncio.sleep(0)  # a has written the request; b has not read it yet
        conn = b.connection(a.local_id)
        assert conn is not None and conn.close_if_idle()
        resp = await asyncio.wait_for(call, 5)
        assert resp.status == 200 and await resp.read() == b"ok"
        await resp.aclose()
        assert served == ["/once"]  # processed exactly once, on a new connection
        assert a.stats.connections_opened == 2
