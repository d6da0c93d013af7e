"""The peer transport bounds the connections that have not finished their handshakes (TLS,
then the peer handshake): in all (`max_handshakes`) and per IP address
(`max_handshakes_per_ip`). Over a cap a connection is closed at TCP accept, long before the
handshake limit, and counted as refused "busy"; honest peers connect again once the flood
ends, and every slot comes back whichever way its connection ended. Real sockets on
loopback; the attacker is a raw TCP (or TLS) client that says nothing."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandshakeRefused, NetError, TlsTransport, TransportConfig
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.testing.poll import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.hostile,
    pytest.mark.filterwarnings("error::ResourceWarning"),
]

CUT_WITHIN_S = 10.0  # a refused connection is closed at once; the handshake limit is 60 s


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


@asynccontextmanager
async def listener(**limits: float | int | None) -> AsyncIterator[tuple[TlsTransport, str]]:
    t = TlsTransport(NodeKey.generate(), psk(), TransportConfig(**limits))  # type: ignore[arg-type]
    await t.start()
    try:
        assert t.listen_addr is not None
        yield t, t.listen_addr
    finally:
        await t.aclose()


@asynccontextmanager
async def silent_clients(addr: str, n: int) -> AsyncIterator[list[asyncio.StreamWriter]]:
    host, port = addr.rsplit(":", 1)
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(n):
            writers.append((await asyncio.open_connection(host, int(port)))[1])
        yield writers
    finally:
        for w in writers:
            w.close()


async def cut_at_once(addr: str) -> bool:
    """Whether a new silent connection to `addr` is closed by the listener in time."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        try:
            while await asyncio.wait_for(reader.read(4096), CUT_WITHIN_S):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
        return True
    finally:
        writer.close()


async def test_silent_connections_from_one_address_are_refused_over_its_cap() -> None:
    async with listener(handshake_timeout=60.0, max_handshakes_per_ip=3) as (t, addr):
        async with silent_clients(addr, 3):
            await wait_until(lambda: t.handshaking.total == 3, 5, "the silent ones counted")
            assert t.handshaking.per_source == {"127.0.0.1": 3}
            assert await cut_at_once(addr)  # over the cap: closed now, not in 60 s
            assert t.stats.handshakes_refused["busy"] == 1
            async with TlsTransport(
                NodeKey.generate(), psk(), TransportConfig(host=None, handshake_timeout=2.0)
            ) as honest:
                with pytest.raises(NetError):  # refused too while the flood holds the slots
                    await honest.connect(addr, t.local_id)
        await wait_until(lambda: t.handshaking.total == 0, 5, "their slots given back")
        assert t.handshaking.per_source == {}
        async with TlsTransport(NodeKey.generate(), psk(), TransportConfig(host=None)) as honest:
            assert await honest.connect(addr, t.local_id) == t.local_id
            # a finished handshake holds no slot while its connection stays open
            await wait_until(lambda: honest.local_id in t.connected_peers(), 5, "registered")
            assert t.handshaking.total == 0


async def test_the_total_cap_holds_whatever_the_addresses() -> None:
    async with listener(handshake_timeout=60.0, max_handshakes=2, max_handshakes_per_ip=None) as (
        t,
        addr,
    ):
        async with silent_clients(addr, 2):
            await wait_until(lambda: t.handshaking.total == 2, 5, "the silent ones counted")
            assert await cut_at_once(addr)
            assert await cut_at_once(addr)
            assert t.stats.handshakes_refused["busy"] == 2
            assert t.handshaking.total == 2
        await wait_until(lambda: t.handshaking.total == 0, 5, "their slots given back")


async def test_a_client_stalled_after_tls_holds_its_slot_until_the_peer_handshake_limit() -> None:
    """TLS done, then nothing: the slot is held through the peer handshake (else finishing
    TLS alone would dodge the cap) and given back when that handshake times out."""
    async with listener(handshake_timeout=1.0, max_handshakes_per_ip=1) as (t, addr):
        host, port = addr.rsplit(":", 1)
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname="")
        try:
            assert t.handshaking.total == 1  # TLS is done; the peer handshake is not
            assert await cut_at_once(addr)
            assert t.stats.handshakes_refused["busy"] == 1
            await wait_until(lambda: t.handshaking.total == 0, 10, "the timed-out slot back")
            assert t.stats.handshakes_refused["timeout"] == 1
            # and that connection was closed: reading to EOF ends (after the server's hello)
            await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()


async def test_a_refused_peer_handshake_gives_its_slot_back() -> None:
    async with listener(max_handshakes_per_ip=1) as (t, addr):
        wrong = PskAdmission("test", b"x" * 32)  # not this fabric's secret
        async with TlsTransport(NodeKey.generate(), wrong, TransportConfig(host=None)) as stranger:
            with pytest.raises(HandshakeRefused):
                await stranger.connect(addr, t.local_id)
        await wait_until(lambda: t.handshaking.total == 0, 5, "the refused one's slot back")
        async with TlsTransport(NodeKey.generate(), psk(), TransportConfig(host=None)) as honest:
            assert await honest.connect(addr, t.local_id) == t.local_id


async def test_a_nodes_metrics_show_a_flood_in_progress(tmp_path: Path) -> None:
    """On a real node, silent connections to its peer listener show in the gauge
    `llmfabric_net_handshakes_in_flight` while they hold their slots, and leave it after."""
    node = Node(
        build_config(
            {},
            {
                "home": tmp_path,
                "listen": "127.0.0.1:0",
                "http_listen": "127.0.0.1:0",
                "preset": "local",
                "network_secret": "handshake-gauge-secret-0123456789",
                "gpu": "cpu",
            },
        )
    )
    await node.start()
    try:
        addr = node.transport.listen_addr
        assert addr is not None
        async with silent_clients(addr, 3):
            await wait_until(lambda: node.transport.handshaking.total == 3, 5, "counted")
            node._refresh_metrics()
            text = generate_latest(node.metrics.registry).decode()
            assert "llmfabric_net_handshakes_in_flight 3.0" in text
        await wait_until(lambda: node.transport.handshaking.total == 0, 5, "given back")
        node._refresh_metrics()
        text = generate_latest(node.metrics.registry).decode()
        assert "llmfabric_net_handshakes_in_flight 0.0" in text
        assert "llmfabric_dataplane_unproven_connections 0.0" in text
    finally:
        await node.stop(drain=False)
