"""The provider's pinned HTTPS listener (node/serve/dataplane_server.py) watches the
connections it accepts with the node's keepalive settings (net/tcp_keepalive.py): read back
with getsockopt from the socket the real server accepted over loopback, and from a plain
`start_watched_server`; the node builds its listener from the config's `keepalive_*` keys."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import ssl
import sys

import pytest

from llmfabric.identity import NodeKey
from llmfabric.net.tcp_keepalive import KeepAlive, start_watched_server
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.testing.poll import wait_until

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="TCP_KEEPIDLE/TCP_USER_TIMEOUT: Linux"
)


def _options(sock: socket.socket) -> dict[str, int]:
    tcp = socket.IPPROTO_TCP
    return {
        "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        "idle": sock.getsockopt(tcp, socket.TCP_KEEPIDLE),
        "interval": sock.getsockopt(tcp, socket.TCP_KEEPINTVL),
        "count": sock.getsockopt(tcp, socket.TCP_KEEPCNT),
        "user_timeout_ms": sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT),
    }


async def test_the_https_listeners_accepted_connections_have_dead_peer_detection() -> None:
    dp = DataPlaneServer(
        NodeKey.generate(),
        lambda: None,
        lambda _peer: False,
        max_body_bytes=1024,
        keepalive=KeepAlive(idle_s=3.0, interval_s=1.5, count=4),
    )
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        port = await dp.start_https("127.0.0.1", 0)
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=insecure, server_hostname=""
        )
        assert dp._runner is not None and dp._runner.server is not None
        server = dp._runner.server
        await wait_until(lambda: server.connections, 5, "the connection accepted")
        [handler] = server.connections
        assert handler.transport is not None
        accepted = handler.transport.get_extra_info("socket")
        # idle 3 s, interval 1.5 -> 2 s, 4 probes: dead after 3 + 2 * 4 = 11 s of silence
        assert _options(accepted) == {
            "keepalive": 1,
            "idle": 3,
            "interval": 2,
            "count": 4,
            "user_timeout_ms": 11_000,
        }
        writer.close()
    finally:
        await dp.aclose()


async def test_a_watched_server_sets_the_options_before_its_first_accept() -> None:
    accepted: list[socket.socket] = []

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append(transport.get_extra_info("socket"))

    server = await start_watched_server(Keep, "127.0.0.1", 0, KeepAlive(7.0, 1.0, 2))
    port = server.sockets[0].getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port)) as client:
            await wait_until(lambda: accepted, 5, "the connection accepted")
            assert _options(accepted[0]) == {
                "keepalive": 1,
                "idle": 7,
                "interval": 1,
                "count": 2,
                "user_timeout_ms": 9000,
            }
            # (the dialing side is the dialer's business: nothing is set on it here)
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    finally:
        server.close()


def test_the_node_watches_its_listener_with_the_configured_keepalive(
    tmp_path: pathlib.Path,
) -> None:
    """The provider uses the same config keys as the ingress (`keepalive_*_s`)."""
    config = build_config(
        {"keepalive_idle_s": 2, "keepalive_interval_s": 1, "keepalive_count": 2},
        {"home": tmp_path, "network_secret": "s" * 24, "gpu": "cpu", "listen": "127.0.0.1:0"},
    )
    assert Node(config).dataplane.keepalive == KeepAlive(idle_s=2, interval_s=1, count=2)
