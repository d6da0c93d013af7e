"""Idle connections are closed, the open-connection cap evicts the least recently used idle
connection, and neither ever closes a connection with a request in flight or a relay
registration connection. Real sockets on loopback; time is a FakeClock shared by the
transports (idle close, eviction and keep-alive all run on it), so "idle for 60 s" is exact
and costs no wall time; only socket I/O is awaited for real."""

import asyncio

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.poll import wait_until as wait_for

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

IDLE = 60.0  # virtual seconds
KEEPALIVE = IDLE / 3  # pings flow while idle: they must not count as use
STEP = IDLE / 16
NO_TIMEOUT = 1e9  # request timeouts run on the fake clock too


def psk() -> PskAdmission:
    return PskAdmission("test", b"s" * 32)


def transport(clock: FakeClock, **cfg: object) -> TlsTransport:
    config = TransportConfig(keepalive=KEEPALIVE, **cfg)  # type: ignore[arg-type]
    return TlsTransport(NodeKey.generate(), psk(), config, clock=clock)


async def pass_time(clock: FakeClock, seconds: float) -> None:
    """Advance virtual time in STEPs, letting the socket I/O each step starts (keep-alive
    pings and their answers, closes) complete in between."""
    for _ in range(round(seconds / STEP)):
        await clock.advance(STEP)
        await asyncio.sleep(0.002)


async def test_idle_connection_is_closed_on_both_sides_and_redialled_on_demand():
    clock = FakeClock()
    a = transport(clock, idle_close_s=IDLE)
    b = transport(clock, idle_close_s=None)
    got: list[bytes] = []
    async with a, b:
        b.set_handler(lambda p, m: got.append(m))
        a.add_peer(b.local_id, [b.listen_addr])
        a.send(b.local_id, b"one")
        await wait_for(lambda: got == [b"one"])
        # Used for twice IDLE: not closed while traffic flows.
        for _ in range(8):
            a.send(b.local_id, b"tick")
            await pass_time(clock, IDLE / 4)
        await wait_for(lambda: len(got) == 9)
        assert a.connection(b.local_id) is not None
        assert a.stats.connections_idle_closed == 0
        # Silence since the last tick (IDLE / 4 ago; keep-alive pings do not count): open
        # before IDLE, closed by IDLE plus one reaper period (IDLE / 4); b sees the close too.
        await pass_time(clock, IDLE / 2)
        assert a.connection(b.local_id) is not None
        await pass_time(clock, IDLE / 2 + STEP)
        await wait_for(lambda: a.connected_peers() == () and b.connected_peers() == ())
        assert a.stats.connections_idle_closed == 1
        a.send(b.local_id, b"two")  # dials again
        await wait_for(lambda: got[-1] == b"two")
        assert a.stats.connections_opened == 2


async def test_busy_and_relay_connections_are_never_reaped():
    clock = FakeClock()
    relay = transport(clock, relay=True, idle_close_s=IDLE)
    natted = transport(clock, host=None, idle_close_s=IDLE)
    a = transport(clock, idle_close_s=IDLE)
    release = asyncio.Event()

    async def slow(req):
        await release.wait()
        return HandlerResponse(200, (), b"done")

    async with relay, natted, a:
        rid = await natted.connect_bootstrap(relay.listen_addr)
        natted.use_relays([rid])
        await natted.wait_relayed(1, timeout=NO_TIMEOUT)
        relay.set_request_handler(slow)
        a.add_peer(relay.local_id, [relay.listen_addr])
        call = asyncio.ensure_future(a.request(relay.local_id, "GET", "/slow",
                                               timeout=NO_TIMEOUT))
        await wait_for(lambda: a.connection(relay.local_id) is not None)
        await pass_time(clock, IDLE * 3)  # twelve reaper rounds
        assert a.connection(relay.local_id) is not None  # request in flight
        assert natted.connection(rid) is not None  # relay registration, both ends
        assert relay.connection(natted.local_id) is not None
        release.set()
        resp = await call
        assert await resp.read() == b"done"
        await resp.aclose()
        await pass_time(clock, IDLE * 1.5)
        await wait_for(lambda: a.connection(relay.local_id) is None)  # idle once done
        assert natted.relays == (rid,) and natted.stats.connections_idle_closed == 0


async def test_connection_cap_evicts_the_least_recently_used_idle_connection():
    clock = FakeClock()
    min_idle = 30.0
    hub = transport(clock, max_connections=2, idle_close_s=None, evict_min_idle_s=min_idle)
    peers = [transport(clock, idle_close_s=None) for _ in range(4)]
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
        busy = asyncio.ensure_future(hub.request(p0, "GET", "/", timeout=NO_TIMEOUT))
        await wait_for(lambda: hub.connection(p0) is not None)
        hub.send(p1, b"x")
        await wait_for(lambda: hub.connection(p1) is not None)
        await pass_time(clock, min_idle + STEP)  # p1 idle long enough to be evicted
        hub.send(p2, b"x")  # third connection: p1 is idle, p0 busy -> p1 goes
        await wait_for(lambda: set(hub.connected_peers()) == {p0, p2})
        assert hub.stats.connections_evicted == 1
        hub.send(p3, b"x")  # p2 was used just now: kept, the cap is exceeded for a while
        await wait_for(lambda: hub.connection(p3) is not None)
        assert set(hub.connected_peers()) == {p0, p2, p3}
        await pass_time(clock, min_idle + STEP)
        hub.send(p1, b"x")  # 4 open, cap 2: the two idle ones (p2, p3) go, busy p0 stays
        await wait_for(lambda: set(hub.connected_peers()) == {p0, p1})
        assert hub.stats.connections_evicted == 3
        release.set()
        resp = await busy
        assert resp.status == 200
        await resp.aclose()
