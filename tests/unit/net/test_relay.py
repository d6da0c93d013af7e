"""RelayService (net/relay.py) on a real, unstarted TlsTransport: its internal endpoints
against hostile bodies (not msgpack, no `addr`, over the 64 KiB limit: read no further and
abort), registration only on a relay, forwarding refused with a reason when this node is no
relay or the target is not connected, relayed datagrams to nobody dropped and counted, a
failing relay listener logged without stopping the bookkeeping, and a dial-back check from a
node with no address answered without a network call. Relaying end to end over sockets is in
tests/integration/test_net_*.py."""

from __future__ import annotations

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
    """Stands for the connection a request came in on: the relay only reads its peer id."""

    peer_id: str


def sender(name: str = "asker") -> PeerConnection:
    return Sender(name)  # type: ignore[return-value]


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


def relay_service(*, relay: bool) -> RelayService:
    t = TlsTransport(NodeKey.generate(), PskAdmission("relay-test", b"s" * 32),
                     TransportConfig(relay=relay))
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


@pytest.mark.parametrize(("is_relay", "reason"), [
    (False, "not a relay"), (True, "natted is not connected")])
async def test_forwarding_is_refused_with_a_reason(is_relay: bool, reason: str) -> None:
    svc = relay_service(relay=is_relay)
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
