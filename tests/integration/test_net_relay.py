"""Relays and reachability on loopback: a node that never listens is reached through a relay."""

import asyncio

import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import (
    HandlerResponse,
    PeerUnreachable,
    TlsTransport,
    TransportConfig,
)
from llmfabric.testing.poll import wait_until as wait_for

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def adm() -> PskAdmission:
    return PskAdmission("test", b"r" * 32)


async def test_request_and_datagrams_reach_a_node_that_only_dials_out():
    relay = TlsTransport(NodeKey.generate(), adm(), TransportConfig(relay=True))
    nated = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))
    public = TlsTransport(NodeKey.generate(), adm())
    got_nated: list[tuple[str, bytes]] = []
    got_public: list[tuple[str, bytes]] = []

    async def serve(req):
        body = await req.read()

        async def gen():
            for word in (b"hello ", req.peer_id.encode(), b" ", body):
                yield word

        return HandlerResponse(200, (("x-served-by", "nated"),), gen())

    async with relay, nated, public:
        nated.set_request_handler(serve)
        nated.set_handler(lambda p, m: got_nated.append((p, m)))
        public.set_handler(lambda p, m: got_public.append((p, m)))
        relay_id = await nated.connect_bootstrap(relay.listen_addr)
        assert nated.advertised_addrs == ()
        nated.use_relays([relay_id])
        assert await nated.wait_relayed(1, timeout=5) == (relay_id,)
        assert nated.relays == (relay_id,) and relay.relay.clients == (nated.local_id,)

        # What the public node learns from the NATed node's record: a dead address + relay.
        await public.connect_bootstrap(relay.listen_addr)
        public.add_peer(nated.local_id, ["127.0.0.1:1"], [relay_id])
        resp = await public.request(nated.local_id, "POST", "/infer", (), b"ping", timeout=5)
        assert resp.status == 200 and resp.via == relay_id
        assert resp.header("x-served-by") == "nated"
        assert await resp.read() == f"hello {public.local_id} ping".encode()
        await resp.aclose()
        assert relay.stats.requests_relayed == 1
        assert public.connection(nated.local_id) is None  # never connected directly

        public.send(nated.local_id, b"gossip-in")
        await wait_for(lambda: got_nated == [(public.local_id, b"gossip-in")])
        # The NATed node reaches the public node by dialling out.
        nated.add_peer(public.local_id, public.advertised_addrs)
        nated.send(public.local_id, b"gossip-out")
        await wait_for(lambda: got_public == [(nated.local_id, b"gossip-out")])


async def test_relay_path_streams_large_bodies_both_ways():
    relay = TlsTransport(NodeKey.generate(), adm(), TransportConfig(relay=True))
    nated = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))
    public = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))

    async def echo(req):
        return HandlerResponse(200, (), req.iter_chunks())

    async with relay, nated, public:
        nated.set_request_handler(echo)
        relay_id = await nated.connect_bootstrap(relay.listen_addr)
        nated.use_relays([relay_id])
        await nated.wait_relayed(1, timeout=5)
        public.add_peer(relay_id, relay.advertised_addrs)
        public.add_peer(nated.local_id, [], [relay_id])
        big = bytes(range(256)) * 12_000  # 3 MB > every flow-control window
        resp = await public.request(nated.local_id, "PUT", "/echo", (), big, timeout=10)
        assert await resp.read() == big
        await resp.aclose()


async def test_a_node_that_is_not_a_relay_refuses_registration_and_forwarding():
    plain = TlsTransport(NodeKey.generate(), adm())
    nated = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))
    other = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))
    async with plain, nated, other:
        pid = await nated.connect_bootstrap(plain.listen_addr)
        nated.use_relays([pid])
        with pytest.raises(TimeoutError):
            await nated.wait_relayed(1, timeout=0.5)
        assert nated.relays == ()
        other.add_peer(pid, plain.advertised_addrs)
        other.add_peer(nated.local_id, [], [pid])
        with pytest.raises(PeerUnreachable, match="relays tried"):
            await other.request(nated.local_id, "GET", "/")


async def test_dialback_tells_whether_the_advertised_address_is_reachable():
    a = TlsTransport(NodeKey.generate(), adm())
    b = TlsTransport(NodeKey.generate(), adm())
    c = TlsTransport(NodeKey.generate(), adm())
    async with a, b, c:
        bid = await a.connect_bootstrap(b.listen_addr)
        assert await a.check_reachability(bid) is True
        assert await a.check_reachability(bid, "127.0.0.1:1") is False
        # An address that answers with another peer id does not count.
        assert await a.check_reachability(bid, c.listen_addr) is False


async def test_relay_connection_is_re_established_after_the_relay_restarts():
    key = NodeKey.generate()
    relay = TlsTransport(key, adm(), TransportConfig(relay=True))
    await relay.start()
    port = int(relay.listen_addr.rsplit(":", 1)[1])
    nated = TlsTransport(
        NodeKey.generate(),
        adm(),
        TransportConfig(host=None, backoff_base=0.05, backoff_cap=0.2),
    )
    changes: list[tuple[str, ...]] = []
    nated.on_relays_changed(changes.append)
    async with nated:
        relay_id = await nated.connect_bootstrap(relay.listen_addr)
        nated.use_relays([relay_id])
        await nated.wait_relayed(1, timeout=5)
        await relay.aclose()
        await wait_for(lambda: nated.relays == ())
        assert changes == [(relay_id,), ()]
        relay2 = TlsTransport(key, adm(), TransportConfig(port=port, relay=True))
        async with relay2:
            await wait_for(lambda: nated.relays == (relay_id,), within=10)
            assert relay2.relay.clients == (nated.local_id,)
            assert changes == [(relay_id,), (), (relay_id,)]


async def test_after_a_failed_direct_dial_requests_go_straight_to_the_relay():
    relay = TlsTransport(NodeKey.generate(), adm(), TransportConfig(relay=True))
    nated = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))
    public = TlsTransport(NodeKey.generate(), adm(), TransportConfig(host=None))

    async def ok(req):
        return HandlerResponse(204)

    attempts = []

    async def black_hole(reader, writer):  # stands in for an address that never answers TLS
        attempts.append(1)
        writer.close()

    hole = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    hole_addr = f"127.0.0.1:{hole.sockets[0].getsockname()[1]}"
    async with relay, nated, public, hole:
        nated.set_request_handler(ok)
        relay_id = await nated.connect_bootstrap(relay.listen_addr)
        nated.use_relays([relay_id])
        await nated.wait_relayed(1, timeout=5)
        public.add_peer(relay_id, relay.advertised_addrs)
        public.add_peer(nated.local_id, [hole_addr], [relay_id])
        for _ in range(3):
            resp = await public.request(nated.local_id, "GET", "/")
            assert resp.status == 204 and resp.via == relay_id
            await resp.aclose()
            public.add_peer(nated.local_id, [hole_addr], [relay_id])  # record refresh
        # One direct attempt, then the relay only: no connect timeout paid per request.
        assert len(attempts) == 1
        assert relay.stats.requests_relayed == 3
        # New addresses in the record: direct dialling is tried again.
        public.add_peer(nated.local_id, [hole_addr, "127.0.0.1:1"], [relay_id])
        resp = await public.request(nated.local_id, "GET", "/")
        await resp.aclose()
        assert len(attempts) == 2
