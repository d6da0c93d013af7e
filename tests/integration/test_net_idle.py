"""Idle connections are closed, the open-connection cap evicts the least recently used idle
connection, and neither ever closes a connection with a request in flight or a relay
registration connection. Real sockets on loopback, short idle times."""

import asyncio

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.testing.poll import wait_until as wait_for

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

IDLE = 0.4


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


async def test_idle_connection_is_closed_on_both_sides_and_redialled_on_demand():
    cfg = TransportConfig(idle_close_s=IDLE)
    a = TlsTransport(NodeKey.generate(), psk(), cfg)
    b = TlsTransport(NodeKey.generate(), psk(), TransportConfig(idle_close_s=None))
    got: list[bytes] = []
    async with a, b:
        b.set_handler(lambda p, m: got.append(m))
        a.add_peer(b.local_id, [b.listen_addr])
        a.send(b.local_id, b"one")
        await wait_for(lambda: got == [b"one"])
        # Keep it used for longer than IDLE: not closed while traffic flows.
        for _ in range(8):
            a.send(b.local_id, b"tick")
            await asyncio.sleep(IDLE / 4)
        assert a.connection(b.local_id) is not None
        assert a.stats.connections_idle_closed == 0
        # Silence (keep-alive pings do not count): a closes, b sees the close too.
        await wait_for(lambda: a.connected_peers() == () and b.connected_peers() == ())
        assert a.stats.connections_idle_closed == 1
        a.send(b.local_id, b"two")  # dials again
        await wait_for(lambda: got[-1] == b"two")
        assert a.stats.connections_opened == 2


async def test_busy_and_relay_connections_are_never_reaped():
    cfg = TransportConfig(idle_close_s=IDLE)
    relay = TlsTransport(NodeKey.generate(), psk(), TransportConfig(relay=True, idle_close_s=IDLE))
    natted = TlsTransport(NodeKey.generate(), psk(), TransportConfig(host=None, idle_close_s=IDLE))
    a = TlsTransport(NodeKey.generate(), psk(), cfg)
    release = asyncio.Event()

    async def slow(req):
        await release.wait()
        return HandlerResponse(200, (), b"done")

    async with relay, natted, a:
        rid = await natted.connect_bootstrap(relay.listen_addr)
        natted.use_relays([rid])
        await natted.wait_relayed(1, timeout=5)
        relay.set_request_handler(slow)
        a.add_peer(relay.local_id, [relay.listen_addr])
        call = asyncio.ensure_future(a.request(relay.local_id, "GET", "/slow", timeout=10))
        await asyncio.sleep(IDLE * 3)  # several reaper rounds
        assert a.connection(relay.local_id) is not None  # request in flight
        assert natted.connection(rid) is not None  # relay registration, both ends
        assert relay.connection(natted.local_id) is not None
        release.set()
        resp = await call
        assert await resp.read() == b"done"
        await resp.aclose()
        await wait_for(lambda: a.connection(relay.local_id) is None)  # idle once done
        assert natted.relays == (rid,) and natted.stats.connections_idle_closed == 0


async def test_connection_cap_evicts_the_least_recently_used_idle_connection():
    cfg = TransportConfig(max_connections=2, idle_close_s=None, evict_min_idle_s=0.2)
    hub = TlsTransport(NodeKey.generate(), psk(), cfg)
    peers = [TlsTransport(NodeKey.generate(), psk()) for _ in range(4)]
    release = asyncio.Event()

    async def slow(req):
        await release.wait()
        return HandlerResponse(200, (), b"ok")

    async with hub, peers[0], peers[1], peers[2], peers[3]:
        for p in peers:
            p.set_handler(lambda src, m: None)
            hub.add_peer(p.local_id, [p.listen_addr])
        p0, p1, p2, p3 = (p.local_id for p in peers)
        peers[0].set_request_handler(slow)
        busy = asyncio.ensure_future(hub.request(p0, "GET", "/", timeout=10))
        await wait_for(lambda: hub.connection(p0) is not None)
        hub.send(p1, b"x")
        await wait_for(lambda: hub.connection(p1) is not None)
        await asyncio.sleep(0.3)  # p1 idle long enough to be evicted
        hub.send(p2, b"x")  # third connection: p1 is idle, p0 busy -> p1 goes
        await wait_for(lambda: set(hub.connected_peers()) == {p0, p2})
        assert hub.stats.connections_evicted == 1
        hub.send(p3, b"x")  # p2 was used just now: kept, the cap is exceeded for a while
        await wait_for(lambda: hub.connection(p3) is not None)
        assert set(hub.connected_peers()) == {p0, p2, p3}
        await asyncio.sleep(0.3)
        hub.send(p1, b"x")  # 4 open, cap 2: the two idle ones (p2, p3) go, busy p0 stays
        await wait_for(lambda: set(hub.connected_peers()) == {p0, p1})
        assert hub.stats.connections_evicted == 3
        release.set()
        resp = await busy
        assert resp.status == 200
        await resp.aclose()
