"""The provider's data-plane HTTPS listener bounds the connections not yet proven (in all and
per IP address), from TCP accept until their first authorized request (TLS, then a valid
X-Fabric-Auth), like the peer listener its two handshakes; the ingress dials one provider at
most `max_dials_per_node` connections at a time, so an honest burst never meets that bound.
Real sockets on loopback: a silent flood is refused at accept and counted, a connection past
TLS keeps its slot until it is authorized (one refused is answered and closed), and 40
concurrent requests through a fresh pinned-HTTPS forwarder all succeed against a provider
that admits only 4 unproven connections at once from the ingress's address."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.forward.secure import DataPlaneSessions, PinnedHttpsForwarder
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.net.handshake import client_ssl_context
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import PeerApi
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.testing.poll import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

PATH = "/v1/chat/completions"
T = Timeouts(connect=10, first_byte=10, idle=10, total=20)


class Echo:
    """Stands in for the node's EngineLink on the HTTPS path: answers with the body."""

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=await request.read(), content_type="application/json")


async def _unused(peer: str, b: bytes) -> HandlerResponse:
    return HandlerResponse(404, (), b"")


def provider(per_ip: int, serving: bool = True, unproven_timeout_s: float = 15.0
             ) -> tuple[TlsTransport, DataPlaneServer]:
    key = NodeKey.generate()
    t = TlsTransport(key, PskAdmission("dp", b"d" * 32), TransportConfig())
    engine = Echo() if serving else None
    dp = DataPlaneServer(key, lambda: engine, lambda _p: False,  # type: ignore[arg-type,return-value]
                         max_body_bytes=1 << 20, max_handshakes_per_ip=per_ip,
                         unproven_timeout_s=unproven_timeout_s)
    t.set_request_handler(PeerApi(dp, _unused).handle)
    return t, dp


async def test_a_silent_flood_is_refused_at_accept_and_its_slots_come_back() -> None:
    prov, dp = provider(per_ip=3)
    async with prov:
        port = await dp.start_https("127.0.0.1", 0)
        try:
            flood = [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(3)]
            await wait_until(lambda: dp.handshaking.total == 3, 5, "the flood counted")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
            writer.close()
            assert dp.refused.get("busy") == 1
            for w in flood:
                w.close()
            await wait_until(lambda: dp.handshaking.total == 0, 5, "their slots given back")
            # TLS done is half the handshake: the slot is held until an authorized request,
            # so connections that complete TLS and then idle still count
            reader, unproven = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ssl_context(), server_hostname="llmfabric")
            await wait_until(lambda: dp.handshaking.total == 1, 5, "the TLS client counted")
            await asyncio.sleep(0.05)
            assert dp.handshaking.total == 1 and len(dp._unproven) == 1
            # ...and one that fails authorization is answered, then closed: it does not get
            # to keep its slot (or try again without paying for another TLS handshake)
            unproven.write(b"POST " + FORWARD_PREFIX.encode() + PATH.encode()
                             + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 401")  # no X-Fabric-Auth
            assert b"connection: close" in head.lower()
            await asyncio.wait_for(reader.read(), 5)  # the server closes
            assert dp.refused.keys() - {"busy"}, dp.refused
            await wait_until(lambda: dp.handshaking.total == 0, 5, "its slot back on close")
            unproven.close()
        finally:
            await dp.aclose()


async def test_a_node_without_engine_closes_an_unproven_connection_after_its_503() -> None:
    _prov, dp = provider(per_ip=3, serving=False)
    port = await dp.start_https("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ssl_context(), server_hostname="llmfabric")
        writer.write(b"POST " + FORWARD_PREFIX.encode() + PATH.encode()
                     + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower()
        await asyncio.wait_for(reader.read(), 5)
        await wait_until(lambda: dp.handshaking.total == 0, 5, "its slot back")
        writer.close()
    finally:
        await dp.aclose()


async def test_an_oversized_chunked_body_is_refused_and_its_connection_closed() -> None:
    """A chunked body has no Content-Length to check before reading: past the limit it is
    refused as the declared case is (400), and the unproven connection is closed."""
    _prov, dp = provider(per_ip=3)
    port = await dp.start_https("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ssl_context(), server_hostname="llmfabric")
        chunk = b"x" * 65536
        writer.write(b"POST " + FORWARD_PREFIX.encode() + PATH.encode()
                     + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + (b"10000\r\n" + chunk + b"\r\n") * 17 + b"0\r\n\r\n")  # > 1 MiB
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 400") and b"connection: close" in head.lower()
        rest = await asyncio.wait_for(reader.read(), 5)
        assert b"request_too_large" in rest
        await wait_until(lambda: dp.handshaking.total == 0, 5, "its slot back")
        writer.close()
    finally:
        await dp.aclose()


async def test_a_connection_unproven_past_its_deadline_is_closed_and_its_slot_returns(
) -> None:
    """TLS done, then silence: aiohttp's keep-alive would keep the connection (and its
    slot) for an hour. It is closed at the unproven deadline instead; a connection that
    proved itself is not touched by that deadline."""
    ing_key = NodeKey.generate()
    prov, dp = provider(per_ip=3, unproven_timeout_s=0.4)
    ing = TlsTransport(ing_key, PskAdmission("dp", b"d" * 32), TransportConfig(host=None))
    async with prov, ing:
        port = await dp.start_https("127.0.0.1", 0)
        try:
            reader, silent = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ssl_context(), server_hostname="llmfabric")
            await wait_until(lambda: dp.handshaking.total == 1, 5, "the TLS client counted")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at the deadline
            await wait_until(lambda: dp.handshaking.total == 0, 5, "its slot back")
            assert dp.refused.get("unproven_timeout") == 1 and not dp._deadlines
            silent.close()
            # an authorized request proves its connection: it outlives the deadline
            await ing.connect_bootstrap(prov.listen_addr)
            raw = RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context())
            fwd = PinnedHttpsForwarder(DataPlaneSessions(ing_key, ing), raw)
            c = Candidate(session_id="s1", peer_id=prov.local_id, provider_id="p",
                          http_addr="127.0.0.1:1", relays=(),
                          hardware=Hardware(gpu_model="H100", gpu_count=1),
                          model=ServedModel("m"), load=LoadHints())
            for i in range(2):
                up = await fwd.open(c, PATH, orjson.dumps({"i": i}), T)
                assert orjson.loads(await up.read()) == {"i": i}
                await up.aclose()
                await asyncio.sleep(0.6)
                [pooled] = [conn for pool in raw._idle.values() for conn in pool]
                assert not pooled.lost and pooled.usable()  # open past the deadline
            assert dp.refused.get("unproven_timeout") == 1
            assert dp.served["https"] == 2 and not dp._deadlines
            await raw.aclose()
        finally:
            await dp.aclose()


async def test_an_honest_burst_is_dialled_within_the_providers_cap() -> None:
    prov, dp = provider(per_ip=4)
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, PskAdmission("dp", b"d" * 32), TransportConfig(host=None))
    async with prov, ing:
        await dp.start_https("127.0.0.1", 0)
        try:
            await ing.connect_bootstrap(prov.listen_addr)
            raw = RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context(), max_dials_per_node=4)
            fwd = PinnedHttpsForwarder(DataPlaneSessions(ing_key, ing), raw)
            c = Candidate(session_id="s1", peer_id=prov.local_id, provider_id="p",
                          http_addr="127.0.0.1:1", relays=(),
                          hardware=Hardware(gpu_model="H100", gpu_count=1),
                          model=ServedModel("m"), load=LoadHints())

            async def one(i: int) -> int:
                body = orjson.dumps({"model": "m", "i": i})
                up = await fwd.open(c, PATH, body, T)
                try:
                    assert orjson.loads(await up.read())["i"] == i
                    return up.status
                finally:
                    await up.aclose()

            statuses = await asyncio.gather(*(one(i) for i in range(40)))
            assert statuses == [200] * 40
            assert "busy" not in dp.refused, dp.refused
            # every connection proved itself with an authorized request: no slot is held,
            # though the connections stay open in the forwarder's pool
            assert dp.handshaking.total == 0 and not dp._unproven
            await raw.aclose()
        finally:
            await dp.aclose()
