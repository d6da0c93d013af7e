"""The transport reports a peer whose connection ended without a CLOSE (its process died):
membership probes that peer at once. A graceful close or an idle close is not reported."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.poll import wait_until as wait_for

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


async def test_a_connection_cut_without_close_reports_the_peer_lost() -> None:
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    lost: list[str] = []
    async with a, b:
        a.on_peer_lost(lost.append)
        await a.connect_bootstrap(b.listen_addr)  # type: ignore[arg-type]
        await wait_for(lambda: b.connection(a.local_id) is not None)
        conn = b.connection(a.local_id)
        assert conn is not None
        conn._writer.transport.abort()  # b's process "dies": RST, no CLOSE frame
        await wait_for(lambda: lost == [b.local_id])
        assert a.connection(b.local_id) is None


async def test_a_failing_peer_lost_callback_is_logged_counted_and_survived(
        caplog: pytest.LogCaptureFixture) -> None:
    a = TlsTransport(NodeKey.generate(), psk())
    b = TlsTransport(NodeKey.generate(), psk())
    lost: list[str] = []

    def callback(peer: str) -> None:
        lost.append(peer)
        raise RuntimeError("membership bug")

    async with a, b:
        a.on_peer_lost(callback)
        with caplog.at_level(logging.ERROR, logger="llmfabric.net.tls_transport"):
            await a.connect_bootstrap(b.listen_addr)  # type: ignore[arg-type]
            await wait_for(lambda: b.connection(a.local_id) is not None)
            conn = b.connection(a.local_id)
            assert conn is not None
            conn._writer.transport.abort()
            await wait_for(lambda: lost == [b.local_id])
        assert a.stats.errors == {"peer_lost_callback": 1}
        [rec] = [r for r in caplog.records if "peer-lost callback failed" in r.getMessage()]
        assert b.local_id in rec.getMessage() and rec.exc_info is not None
        await a.connect_bootstrap(b.listen_addr)  # type: ignore[arg-type]  # still working
        assert a.connection(b.local_id) is not None


async def test_graceful_and_idle_closes_are_not_reported() -> None:
    a = TlsTransport(NodeKey.generate(), psk())
    clock = FakeClock()  # b's idle close runs on virtual time: no wall-time wait
    b = TlsTransport(NodeKey.generate(), psk(), TransportConfig(idle_close_s=60.0),
                     clock=clock)
    lost: list[str] = []
    async with a:
        a.on_peer_lost(lost.append)
        async with b:
            await a.connect_bootstrap(b.listen_addr)  # type: ignore[arg-type]
            await wait_for(lambda: b.connection(a.local_id) is not None)
            await clock.run_until(lambda: b.connection(a.local_id) is None, 120, step=5)
            await wait_for(lambda: a.connection(b.local_id) is None)  # idle close
            assert b.stats.connections_idle_closed >= 1
            await a.connect_bootstrap(b.listen_addr)  # type: ignore[arg-type]
            await wait_for(lambda: b.connection(a.local_id) is not None)
        # b shut down gracefully (CLOSE frame)
        await wait_for(lambda: a.connection(b.local_id) is None)
        await asyncio.sleep(0.1)
    assert lost == []
