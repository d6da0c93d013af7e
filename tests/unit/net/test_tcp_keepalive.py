"""Dead-peer detection options (net/tcp_keepalive.py) on real sockets, and on the direct
forwarder's upstream connections (forward/raw.py)."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.ingress import Timeouts
from llmfabric.net.tcp_keepalive import KeepAlive, set_keepalive
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate

linux = pytest.mark.skipif(sys.platform != "linux", reason="TCP_KEEPIDLE/TCP_USER_TIMEOUT: Linux")


def _options(sock: socket.socket) -> dict[str, int]:
    tcp = socket.IPPROTO_TCP
    return {
        "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        "idle": sock.getsockopt(tcp, socket.TCP_KEEPIDLE),
        "interval": sock.getsockopt(tcp, socket.TCP_KEEPINTVL),
        "count": sock.getsockopt(tcp, socket.TCP_KEEPCNT),
        "user_timeout_ms": sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT),
    }


@linux
def test_set_keepalive_sets_every_option_rounded_up_to_kernel_units() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        set_keepalive(sock, KeepAlive(idle_s=1.5, interval_s=0.2, count=4))
        # idle 1.5 -> 2 s, interval 0.2 -> 1 s; dead after 2 + 1 * 4 = 6 s of silence
        assert _options(sock) == {
            "keepalive": 1,
            "idle": 2,
            "interval": 1,
            "count": 4,
            "user_timeout_ms": 6000,
        }


def test_keepalive_settings_are_validated() -> None:
    assert KeepAlive().dead_after_s == 5 + 2 * 3
    # beyond Linux's limits every connect would fail with EINVAL: refused up front
    for bad in ((0.0, 2.0, 3), (5.0, -1.0, 3), (5.0, 2.0, 0), (32768.0, 2.0, 3),
                (5.0, 32768.0, 3), (5.0, 2.0, 128)):
        with pytest.raises(ValueError, match="keepalive"):
            KeepAlive(*bad)


@linux
def test_the_largest_settings_fit_the_kernels_option_types() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as sock:
        set_keepalive(sock, KeepAlive(idle_s=32767, interval_s=32767, count=127))
        # 32767 * 128 s in ms overflows TCP_USER_TIMEOUT's C int: clamped, not OverflowError
        assert _options(sock)["user_timeout_ms"] == 2**31 - 1


@linux
async def test_the_direct_forwarders_upstream_connections_have_dead_peer_detection() -> None:
    served = asyncio.Event()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await w.drain()
            await r.read()  # (keep the connection open until the client closes it)
        finally:
            w.close()
            served.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cand = Candidate(
        "n1",
        "peer-n1",
        "p",
        f"127.0.0.1:{port}",
        (),
        Hardware("H100", 1),
        ServedModel("m"),
        LoadHints(),
    )
    fwd = RawHttpForwarder()
    timeouts = Timeouts(keepalive_idle=3.0, keepalive_interval=1.0, keepalive_count=2)
    try:
        up = await fwd.open(cand, "/v1/chat/completions", b"{}", timeouts)
        assert await up.read() == b"{}"
        await up.aclose()
        [conn] = fwd._idle[f"127.0.0.1:{port}"]  # the pooled connection it used
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        assert _options(sock) == {
            "keepalive": 1,
            "idle": 3,
            "interval": 1,
            "count": 2,
            "user_timeout_ms": 5000,
        }
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        await fwd.aclose()
        # (the server's end closes once it sees the client's: else the loop ends first and
        # leaves that transport for the collector, in whichever test runs next)
        await asyncio.wait_for(served.wait(), 10)
        server.close()
        await server.wait_closed()
