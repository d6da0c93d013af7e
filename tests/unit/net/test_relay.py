"""RelayService (net/relay.py) on a real, unstarted TlsTransport: its internal endpoints
against hostile bodies (not msgpack, no `addr`, over the 64 KiB limit: read no further and
abort), registration only on a relay, forwarding refused with a reason when this node is no
relay or the target is not connected, relayed datagrams to nobody dropped and counted, a
failing relay listener logged without stopping the bookkeeping, and a dial-back check from a
node with no address answered without a network call. Relaying end to end over sockets is in
tests/integration/test_net_*.py."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgpack
import pytest

from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.net import TlsTransport, TransportConfig
from llmfabric.net.connection import PeerConnection
from llmfabric.net.messages import BodyStream, find_header
from llmfabric.net.relay import DIALBACK_PATH, MAX_INTERNAL_BODY, REGISTER_PATH, RelayService
from llmfabric.net.serving import ORIGIN, RELAY_ERROR, RELAY_TO


@dataclass
class Sender:
    """Stands for the connection a request came in on: the relay reads its peer id and its
    source address."""

    peer_id: str
    source: str = "10.0.0.1"  # the address per-source caps count it against
    member: str = ""  # a certificate's provider (fair shares on certificate networks)


def sender(name: str = "asker", source: str = "10.0.0.1", member: str = "") -> PeerConnection:
    return Sender(name, source, member)  # type: ignore[return-value]


class Body:
    """A request body as the h2 session delivers it; records acks and an abort."""

    def __init__(self, *chunks: bytes) -> None:
        self.acked = 0
        self.aborted = False
        self.stream = BodyStream(self._ack, self._abort)
        for chunk in chunks:
            self.stream.push((chunk, len(chunk)))
        self.stream.push(None)

    def _ack(self, n: int) -> None:
        self.acked += n

    def _abort(self) -> None:
        self.aborted = True


def relay_service(*, relay: bool, max_clients: int | None = 1024,
                  max_clients_per_ip: int | None = 512) -> RelayService:
    t = TlsTransport(NodeKey.generate(), PskAdmission("relay-test", b"s" * 32),
                     TransportConfig(relay=relay, relay_max_clients=max_clients,
                                     relay_max_clients_per_ip=max_clients_per_ip))
    return t.relay


@pytest.mark.parametrize(("chunks", "aborted"), [
    ((b"\xc1 not msgpack",), False),
    ((msgpack.packb({"address": "127.0.0.1:1"}),), False),  # no `addr`
    ((msgpack.packb(["127.0.0.1:1"]),), False),  # not a map
    ((b"\x00" * MAX_INTERNAL_BODY, b"\x00" * 16, b"never read"), True),  # over the limit
])
async def test_a_hostile_dialback_body_is_a_400(chunks: tuple[bytes, ...],
                                                aborted: bool) -> None:
    body = Body(*chunks)
    resp = await relay_service(relay=False).handle_internal(sender(), "POST", DIALBACK_PATH,
                                                            body.stream)
    assert resp.status == 400 and b"msgpack {addr}" in bytes(resp.body)  # type: ignore[arg-type]
    assert body.aborted is aborted
    assert body.acked <= MAX_INTERNAL_BODY + 16  # what was over the limit was never taken


async def test_only_a_relay_registers_clients_and_protects_their_connections() -> None:
    plain = relay_service(relay=False)
    resp = await plain.handle_internal(sender("natted"), "POST", REGISTER_PATH, Body().stream)
    assert resp.status == 403 and plain.clients == () and not plain.is_protected("natted")
    relay = relay_service(relay=True)
    resp = await relay.handle_internal(sender("natted"), "POST", REGISTER_PATH, Body().stream)
    assert resp.status == 200 and relay.clients == ("natted",)
    assert relay.is_protected("natted")  # never closed for idleness
    resp = await relay.handle_internal(sender(), "GET", "/_llmfabric/other", Body().stream)
    assert resp.status == 404


@pytest.mark.hostile
async def test_registrations_are_capped_in_all_and_per_source_address() -> None:
    """A registration's connection is never closed for idleness or the connection cap, and
    sybil keys are free on a PSK network: registrations from one address stop at the
    per-source cap, all of them at the total cap (503, counted) unless the newcomer's party
    holds two fewer than the largest, a registered client may register again, and a client
    that left gives its slot back."""
    relay = relay_service(relay=True, max_clients=4, max_clients_per_ip=2)

    async def register(name: str, source: str) -> int:
        resp = await relay.handle_internal(sender(name, source), "POST", REGISTER_PATH,
                                           Body().stream)
        return resp.status

    assert [await register(f"sybil{k}", "10.6.6.6") for k in range(3)] == [200, 200, 503]
    assert await register("sybil0", "10.6.6.6") == 200  # already registered: still fine
    assert await register("site-a", "10.0.1.1") == 200
    assert await register("site-b", "10.0.2.1") == 200
    # four in all; site-c's network holds none, the sybils' two: one of them makes room
    assert await register("site-c", "10.0.3.1") == 200
    assert relay.clients == ("site-a", "site-b", "site-c", "sybil0")
    assert await register("site-d", "10.0.4.1") == 503  # every party holds one: full
    assert not relay.is_protected("sybil1") and not relay.is_protected("site-d")
    assert relay.t.stats.dropped["relay_full"] == 2
    assert relay.t.stats.dropped["relay_evicted"] == 1
    relay.t.connection = lambda peer: None  # type: ignore[method-assign,assignment,return-value]
    relay.on_closed(sender("sybil0", "10.6.6.6"))  # its connection is gone: the slot is free
    assert await register("site-d", "10.0.4.1") == 200
    assert await register("sybil2", "10.6.6.6") == 503  # the total is full again
    assert "sybil0" not in relay.clients and len(relay._shares) == 4


def relay_with_closes(max_clients: int) -> tuple[RelayService, list[str]]:
    """A relay whose registered clients' connections record being closed."""
    relay = relay_service(relay=True, max_clients=max_clients, max_clients_per_ip=None)
    closed: list[str] = []

    class Conn:
        def __init__(self, peer: str) -> None:
            self.peer = peer

        async def aclose(self) -> None:
            closed.append(self.peer)

    relay.t.connection = lambda peer: Conn(peer)  # type: ignore[method-assign,assignment,return-value]
    return relay, closed


async def register(relay: RelayService, name: str, source: str, member: str = "") -> int:
    resp = await relay.handle_internal(sender(name, source, member), "POST", REGISTER_PATH,
                                       Body().stream)
    return resp.status


@pytest.mark.hostile
async def test_a_member_with_many_addresses_cannot_keep_a_full_relay_from_newcomers() -> None:
    """PSK network (keys free): an attacker registers sybils from 200 addresses of its /24
    and 200 IPv6 /64s of its /48 (the per-address cap never bites) and fills the relay: its
    two networks are two parties, which share the relay between them. Each honest NATed
    newcomer from another network still gets a slot (the attacker's least recently used
    registration makes room, its connection closed); honest holders are never evicted while
    within their share, and the attacker's retries with fresh keys are refused."""
    relay, closed = relay_with_closes(max_clients=64)
    v4 = [f"203.0.113.{k}" for k in range(200)]
    v6 = [f"2001:db8:666:{k:x}::/64" for k in range(200)]
    statuses = [await register(relay, f"sybil{k}", src) for k, src in enumerate(v4 + v6)]
    assert statuses[:64] == [200] * 64 and set(statuses[64:200]) == {503}
    assert statuses[200:232] == [200] * 32 and set(statuses[232:]) == {503}  # 32 / 32
    await asyncio.sleep(0)  # (the evicted connections' closes run)
    assert closed == [f"sybil{k}" for k in range(32)]  # its own v4 ones, oldest first
    relay._shares.touch("sybil32")  # (a relayed request for it: it is not the first to go)
    honest = [(f"home{k}", f"198.51.{k}.7") for k in range(10)]
    honest.append(("v6home", "2001:db8:beef:1::/64"))
    for name, src in honest:
        assert await register(relay, name, src) == 200
    await asyncio.sleep(0)
    made_room = closed[32:]
    assert len(made_room) == len(honest) and all(n.startswith("sybil") for n in made_room)
    assert "sybil32" not in made_room and "sybil33" in made_room
    # The attacker retries with fresh keys from every address it has: refused, and nobody
    # honest is evicted (each honest party holds one, fewer than the attacker's parties).
    for k, src in enumerate(v4 + v6):
        assert await register(relay, f"fresh{k}", src) == 503
    assert all(name in relay.clients for name, _ in honest)
    assert len(relay.clients) == 64 and relay.t.stats.dropped["relay_full"] == 304 + 400


@pytest.mark.hostile
async def test_shares_converge_and_honest_holders_within_theirs_stay() -> None:
    """Two honest sites with four clients each and an attacker with the other 8 of 16 slots:
    the sites' newcomers take the attacker's slots until no party holds two more than
    another (6 / 5 / 5); from then on every registration is refused and nobody is evicted. A
    new party still gets a slot, from the largest party, honest or not."""
    relay, closed = relay_with_closes(max_clients=16)
    for k in range(4):
        assert await register(relay, f"a{k}", "192.0.2.10") == 200
        assert await register(relay, f"b{k}", "198.51.100.10") == 200
    for k in range(8):
        assert await register(relay, f"evil{k}", f"203.0.113.{k}") == 200
    assert [await register(relay, f"a{k}", "192.0.2.10") for k in range(4, 7)] == [200, 200,
                                                                                     503]
    assert await register(relay, "b4", "198.51.100.10") == 200
    await asyncio.sleep(0)
    assert closed == ["evil0", "evil1", "evil2"]
    parties = ("net:192.0.2.0/24", "net:198.51.100.0/24", "net:203.0.113.0/24")
    assert [relay._shares.held(p) for p in parties] == [6, 5, 5]
    for name, src in (("b5", "198.51.100.10"), ("a6", "192.0.2.10"),
                      *((f"evil{k}", f"203.0.113.{k}") for k in range(8, 20))):
        assert await register(relay, name, src) == 503
    assert [relay._shares.held(p) for p in parties] == [6, 5, 5]
    assert await register(relay, "c0", "192.0.3.1") == 200  # a fourth party: a0 makes room
    await asyncio.sleep(0)
    assert closed[-1] == "a0" and relay._shares.largest == 5


@pytest.mark.hostile
async def test_on_a_certificate_network_the_share_is_the_provider_not_the_address() -> None:
    """A provider's sybils from addresses in 50 networks count as one party (the provider
    its certificate names): an honest provider's newcomer evicts one of them. A member whose
    certificate names no provider is its own party (its peer id)."""
    relay, closed = relay_with_closes(max_clients=32)
    for k in range(50):
        status = await register(relay, f"evil{k}", f"10.{k}.0.1", member="evil-corp")
        assert status == (200 if k < 32 else 503)
    assert await register(relay, "honest", "10.0.0.2", member="good-gpus") == 200
    assert await register(relay, "solo", "10.0.0.3", member="solo") == 200
    await asyncio.sleep(0)
    assert closed == ["evil0", "evil1"]
    assert relay._shares.held("member:evil-corp") == 30


@pytest.mark.parametrize(("is_relay", "registered", "reason"), [
    (False, True, "not a relay"), (True, True, "natted is not connected"),
    # a peer that did not register takes the relay's connection for the sender: a member
    # could have its requests counted as the relay's own (its session exchanges)
    (True, False, "natted is not registered with this relay")])
async def test_forwarding_is_refused_with_a_reason(is_relay: bool, registered: bool,
                                                   reason: str) -> None:
    svc = relay_service(relay=is_relay)
    if registered:
        svc._clients["natted"] = "10.0.0.9"
    headers = ((RELAY_TO, "natted"), (ORIGIN, "forged-origin"))
    resp = await svc.forward(sender(), "POST", "/v1/x", headers, Body(b"payload").stream)
    assert resp.status == 502 and find_header(resp.headers, RELAY_ERROR) == reason
    assert svc.t.stats.requests_relayed == 0


def test_a_datagram_for_nobody_is_dropped_and_counted() -> None:
    for is_relay in (False, True):
        svc = relay_service(relay=is_relay)
        svc.forward_datagram(sender(), "nobody", b"hi")
        assert svc.t.stats.dropped == {"unreachable": 1}


def test_a_failing_relay_listener_is_logged_and_the_relays_still_change(
        caplog: pytest.LogCaptureFixture) -> None:
    svc = relay_service(relay=False)
    heard: list[tuple[str, ...]] = []

    def listener(relays: tuple[str, ...]) -> None:
        heard.append(relays)
        raise RuntimeError("listener bug")

    svc.listener = listener
    svc._my_relays.add("r1")
    with caplog.at_level(logging.ERROR, logger="llmfabric.net.relay"):
        svc._notify()
        svc.drop(["r1"])
    assert heard == [("r1",), ()] and svc.relays == ()
    assert svc.t.stats.errors == {"relay_listener": 2}
    failures = [r for r in caplog.records if "relay listener failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


async def test_a_node_without_an_address_is_not_dialled_back() -> None:
    svc = relay_service(relay=False)  # never started: it listens nowhere
    got = await svc.check_reachability("some-peer")
    assert not got.ok and "no address to dial back" in got.reason


class _Target:
    """The relay's connection to a registered client: streams open until closed; past
    `cap` open streams the h2 session refuses, as a real one does at 100."""

    def __init__(self, cap: int = 1000) -> None:
        self.cap, self.open = cap, 0
        self.client = self

    async def request(self, method: str, path: str, peer: str, headers: object,
                      body: object) -> tuple[int, tuple[()], BodyStream, None]:
        import h2.exceptions

        if self.open >= self.cap:
            raise h2.exceptions.TooManyStreamsError(f"Max outbound streams is {self.cap}")
        self.open += 1
        return 200, (), BodyStream(lambda _n: None, lambda: None), None


@pytest.mark.hostile
async def test_one_sender_cannot_hold_every_stream_to_a_natted_node() -> None:
    """One member holding 100 relayed requests open (bodies that never end) took every stream
    of the relay's connection to a NATed node, and everyone else got 500s that no caller
    failed over on. A sender may hold 16 open; a full target is a 502 with the relay error
    (callers try the node's next relay)."""
    from llmfabric.net.relay import MAX_RELAYED_PER_SENDER

    svc = relay_service(relay=True)
    svc._clients["natted"] = "10.0.0.9"
    target = _Target()
    svc.t.connection = lambda peer: target  # type: ignore[method-assign,assignment,return-value]
    headers = ((RELAY_TO, "natted"),)
    held = [await svc.forward(sender("mallory"), "POST", "/v1/x", headers, Body().stream)
            for _ in range(MAX_RELAYED_PER_SENDER)]
    assert all(r.status == 200 for r in held)
    refused = await svc.forward(sender("mallory"), "POST", "/v1/x", headers, Body().stream)
    assert refused.status == 502 and "yours are open" in find_header(refused.headers,
                                                                      RELAY_ERROR)
    ok = await svc.forward(sender("honest"), "POST", "/v1/x", headers, Body().stream)
    assert ok.status == 200
    pipe = held[0].body
    await pipe.aclose()  # type: ignore[union-attr]  # one of mallory's ends: a slot again
    again = await svc.forward(sender("mallory"), "POST", "/v1/x", headers, Body().stream)
    assert again.status == 200
    target.cap = target.open  # the connection's streams are all taken
    full = await svc.forward(sender("honest"), "POST", "/v1/x", headers, Body().stream)
    assert full.status == 502 and "Max outbound streams" in find_header(full.headers,
                                                                         RELAY_ERROR)


@pytest.mark.hostile
async def test_dialback_is_no_port_scanner() -> None:
    """Any member asked any node to dial any address and read open ports (a TLS error) from
    closed ones (connection refused) in the answer: 100 loopback ports in 0.07 s. The answer
    says only that no handshake as the asker happened there, and dial-backs per peer are
    rate limited (a burst of 4: a starting node retries each bootstrap peer)."""
    import asyncio
    import socket

    async def plain_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # a hidden non-TLS service
        await writer.drain()
        writer.close()

    svc = relay_service(relay=False)
    server = await asyncio.start_server(plain_http, "127.0.0.1", 0)
    listening_port = server.sockets[0].getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    answers = []
    try:
        for port in (listening_port, closed_port):
            body = Body(msgpack.packb({"addr": f"127.0.0.1:{port}"}))
            resp = await svc.handle_internal(sender("scanner"), "POST", DIALBACK_PATH,
                                             body.stream)
            assert resp.status == 200
            answers.append(msgpack.unpackb(resp.body))
        assert answers[0] == answers[1] and answers[0]["ok"] is False
        for _ in range(2):
            body = Body(msgpack.packb({"addr": f"127.0.0.1:{closed_port}"}))
            await svc.handle_internal(sender("scanner"), "POST", DIALBACK_PATH, body.stream)
        body = Body(msgpack.packb({"addr": f"127.0.0.1:{closed_port}"}))
        resp = await svc.handle_internal(sender("scanner"), "POST", DIALBACK_PATH, body.stream)
        assert resp.status == 429
        body = Body(msgpack.packb({"addr": f"127.0.0.1:{closed_port}"}))
        other = await svc.handle_internal(sender("other"), "POST", DIALBACK_PATH, body.stream)
        assert other.status == 200
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.hostile
async def test_relayed_datagrams_are_rate_limited_per_sender() -> None:
    """A member flooding datagrams through the relay filled its write buffer to a NATed node,
    which the node's own gossip and probes share (they were dropped: the node looked dead).
    Past a burst, a sender's datagrams pass at DGRAM_RATE_PER_S; others are not held back."""
    from llmfabric.net.relay import DGRAM_BURST

    sent: list[str] = []

    class Out:
        def send_routed(self, kind: object, origin: str, payload: bytes) -> None:
            sent.append(origin)

    svc = relay_service(relay=True)
    svc._clients["natted"] = "10.0.0.9"
    svc.t.connection = lambda peer: Out()  # type: ignore[method-assign,assignment,return-value]
    for _ in range(int(DGRAM_BURST) + 500):
        svc.forward_datagram(sender("flooder"), "natted", b"x")
    svc.forward_datagram(sender("honest"), "natted", b"ping")
    assert sent.count("flooder") <= DGRAM_BURST + 5 and sent.count("honest") == 1
    assert svc.t.stats.dropped["relay_rate"] >= 495
