"""The encrypted data plane on loopback with real transports: the signed session exchange,
the pinned HTTPS direct path, sealed requests through a relay (what the relay carries is
ciphertext; a changed byte fails the response), replayed / tampered / expired / unsigned
requests refused, and control requests that must be signed by the controller."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from llmfabric.dataplane.authz import AUTH_HEADER, authorize
from llmfabric.dataplane.control import SIGNED_HEADER, sign_control
from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.forward.secure import (
    DataPlaneSessions,
    PinnedHttpsForwarder,
    SealedPeerForwarder,
)
from llmfabric.identity import NodeKey, PskAdmission
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamConnectError, UpstreamError
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.tracing import Tracer, current_trace, traced
from llmfabric.net import HandlerResponse, TlsTransport, TransportConfig
from llmfabric.net.handshake import client_ssl_context
from llmfabric.node.serve.dataplane_server import DataPlaneServer
from llmfabric.node.serve.peer_api import ASSIGN_PATH, PeerApi
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NodeHop

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

PROMPT = "the secret prompt 7f3a"
PATH = "/v1/chat/completions"
T = Timeouts(connect=5, first_byte=5, idle=5, total=10)


def adm() -> PskAdmission:
    return PskAdmission("dp-test", b"d" * 32)


class EchoEngine:
    """Stands in for the node's EngineLink: echoes the body back as an SSE stream."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.traceparents: list[str | None] = []

    async def serve_body(self, path: str, body: bytes, traceparent: str | None = None
                         ) -> HandlerResponse:
        self.bodies.append(body)
        self.traceparents.append(traceparent)

        async def gen() -> AsyncIterator[bytes]:
            for i in range(3):
                yield b"data: " + orjson.dumps({"i": i, "echo": body.decode()}) + b"\n\n"

        # (as EngineLink does for a traced request: its time, passed on outside the seal)
        return HandlerResponse(200, (("content-type", "text/event-stream"),
                                     ("x-fabric-node-time", "1.5")), gen())

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        return web.json_response({"echo": body.decode()})


class Spy:
    """Wraps the ingress's transport: records what it hands to the network (and may flip a
    byte of the response, as a hostile relay would)."""

    def __init__(self, inner: TlsTransport, flip: bool = False) -> None:
        self.inner = inner
        self.flip = flip
        self.sent: list[bytes] = []
        self.received: list[bytes] = []

    async def request(self, peer_id: str, method: str, path: str,
                      headers: Sequence[tuple[str, str]], body: bytes, *,
                      timeout: float = 30.0) -> Any:  # noqa: ASYNC109
        self.sent.append(body)
        resp = await self.inner.request(peer_id, method, path, headers, body, timeout=timeout)
        return SpiedResponse(self, resp, self.flip and path.startswith(FORWARD_PREFIX))


class SpiedResponse:
    def __init__(self, spy: Spy, resp: Any, flip: bool) -> None:
        self.spy, self.resp, self.flip = spy, resp, flip
        self.status, self.headers, self.via = resp.status, resp.headers, resp.via

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        async for c in self.resp.iter_chunks():
            if self.flip and len(c) > 8:
                c = c[:6] + bytes([c[6] ^ 1]) + c[7:]
            self.spy.received.append(c)
            yield c

    async def aclose(self) -> None:
        await self.resp.aclose()


class Sink:
    """Where `traced` puts the response's X-Fabric-Trace."""

    headers: dict[str, str] | None = None


def cand(peer_id: str, http_addr: str = "", relays: tuple[str, ...] = ()) -> Candidate:
    return Candidate(session_id="s1", peer_id=peer_id, provider_id="p", http_addr=http_addr,
                     relays=relays, hardware=Hardware(gpu_model="H100", gpu_count=1),
                     model=ServedModel("m"), load=LoadHints())


def body() -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": PROMPT}]})


async def _provider(engine: EchoEngine, members: set[str], host: str | None = "127.0.0.1",
                    assigned: list[str] | None = None) -> tuple[TlsTransport, DataPlaneServer]:
    key = NodeKey.generate()
    t = TlsTransport(key, adm(), TransportConfig(host=host))
    dp = DataPlaneServer(key, lambda: engine, members.__contains__,  # type: ignore[arg-type,return-value]
                         max_body_bytes=1 << 20)

    async def assign(peer: str, b: bytes) -> HandlerResponse:
        if assigned is not None:
            assigned.append(peer)
        return HandlerResponse(202, (), b"ok")

    t.set_request_handler(PeerApi(dp, assign).handle)
    return t, dp


async def test_direct_path_is_pinned_https_with_one_exchange_per_pair() -> None:
    engine = EchoEngine()
    prov, dp = await _provider(engine, set())
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    async with prov, ing:
        port = await dp.start_https("127.0.0.1", 0)
        await ing.connect_bootstrap(prov.listen_addr)
        sessions = DataPlaneSessions(ing_key, ing)
        fwd = PinnedHttpsForwarder(sessions, RawHttpForwarder(FORWARD_PREFIX,
                                                              ssl=client_ssl_context()))
        c = cand(prov.local_id, "127.0.0.1:1")  # only the host of http_addr is used
        for _ in range(3):
            up = await fwd.open(c, PATH, body(), T)
            assert up.status == 200
            assert orjson.loads(await up.read())["echo"] == body().decode()
            await up.aclose()
        assert sessions.exchanges == 1 and len(dp.sessions) == 1
        assert engine.bodies == [body()] * 3

        # The HTTPS listener takes nothing without a valid, fresh authorization.
        s = sessions.cached(prov.local_id)
        assert s is not None
        url = f"https://127.0.0.1:{port}{FORWARD_PREFIX}{PATH}"
        full = (FORWARD_PREFIX + PATH).encode()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        async with aiohttp.ClientSession() as http:

            async def post(header: bytes | None, data: bytes) -> tuple[int, str]:
                hdrs = {AUTH_HEADER: header.decode()} if header is not None else {}
                async with http.post(url, data=data, headers=hdrs, ssl=insecure) as r:
                    return r.status, (await r.text())

            header, _ = authorize(s, full, body(), time.time())
            assert (await post(header, body()))[0] == 200
            status, text = await post(header, body())  # the same request again: a replay
            assert status == 401 and "replayed" in text
            header, _ = authorize(s, full, body(), time.time())
            status, text = await post(header, body().replace(b"secret", b"public"))
            assert status == 401 and "bad_mac" in text
            header, _ = authorize(s, full, body(), time.time() - 60)
            status, text = await post(header, body())
            assert status == 401 and "expired" in text
            header, _ = authorize(s, full, body(), time.time() + 3600)
            assert "bad_expiry" in (await post(header, body()))[1]
            assert (await post(None, body()))[0] == 401
        assert engine.bodies == [body()] * 4
        assert dp.refused == {"replayed": 1, "bad_mac": 1, "expired": 1, "bad_expiry": 1,
                              "bad_authorization": 1}

        # A server that is not the candidate's node is refused at the TLS pin.
        raw = RawHttpForwarder(FORWARD_PREFIX, ssl=client_ssl_context())
        with pytest.raises(UpstreamConnectError, match="is not node"):
            await raw.open_to(f"127.0.0.1:{port}", PATH, body(), T, pin=ing_key.peer_id)
        await raw.aclose()
        await fwd.aclose()
        await dp.aclose()


async def test_a_restarted_provider_gets_a_new_session_transparently() -> None:
    engine = EchoEngine()
    prov, dp = await _provider(engine, set())
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    async with prov, ing:
        await dp.start_https("127.0.0.1", 0)
        await ing.connect_bootstrap(prov.listen_addr)
        sessions = DataPlaneSessions(ing_key, ing)
        fwd = PinnedHttpsForwarder(sessions, RawHttpForwarder(FORWARD_PREFIX,
                                                              ssl=client_ssl_context()))
        c = cand(prov.local_id, "127.0.0.1:1")
        await (await fwd.open(c, PATH, body(), T)).aclose()
        dp.sessions._sessions.clear()  # the provider forgot every session (a restart)
        up = await fwd.open(c, PATH, body(), T)
        assert up.status == 200 and sessions.exchanges == 2
        await up.aclose()
        await fwd.aclose()
        await dp.aclose()


@pytest.mark.parametrize("flip", [False, True])
async def test_relayed_path_is_sealed_end_to_end(flip: bool) -> None:
    engine = EchoEngine()
    members: set[str] = set()
    relay = TlsTransport(NodeKey.generate(), adm(), TransportConfig(relay=True))
    prov, _dp = await _provider(engine, members, host=None)
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    async with relay, prov, ing:
        relay_id = await prov.connect_bootstrap(relay.listen_addr)
        prov.use_relays([relay_id])
        assert await prov.wait_relayed(1, timeout=5) == (relay_id,)
        await ing.connect_bootstrap(relay.listen_addr)
        ing.add_peer(prov.local_id, [], [relay_id])
        spy = Spy(ing, flip=flip)
        sessions = DataPlaneSessions(ing_key, spy)
        fwd = SealedPeerForwarder(sessions, spy)
        c = cand(prov.local_id, relays=(relay_id,))

        # Through a relay the origin is only the relay's word: a signer the provider does
        # not know as a member gets no session.
        with pytest.raises(UpstreamError, match="not_a_member"):
            await fwd.open(c, PATH, body(), T)
        members.add(ing_key.peer_id)

        if flip:  # a relay that changes one byte of the response is caught
            with pytest.raises(UpstreamError, match=r"altered|invalid|cut short"):
                up = await fwd.open(c, PATH, body(), T)
                [x async for x in up.chunks()]
            return
        # What the relay is handed: each relayed request's headers (the bodies are spy.sent).
        relayed_heads: list[tuple[tuple[str, str], ...]] = []
        forward = relay.relay.forward

        async def recording(conn: Any, method: str, path: str, headers: Any,
                            b: Any) -> HandlerResponse:
            if path.startswith(FORWARD_PREFIX):  # (not the session exchanges)
                relayed_heads.append(tuple(headers))
            return await forward(conn, method, path, headers, b)

        relay.relay.forward = recording  # type: ignore[method-assign]
        up = await fwd.open(c, PATH, body(), T)  # untraced
        assert up.status == 200 and up.content_type == "text/event-stream"
        got = b"".join([x async for x in up.chunks()])
        await up.aclose()
        # A traced request: the provider gets its traceparent; the relay never the trace id.
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"

        async def traced_call() -> None:
            tr = current_trace()
            assert tr is not None
            tr.open_attempt(c.peer_id)
            up = await fwd.open(c, PATH, body(), T)
            assert up.hop == NodeHop(1.5, relay_id)  # (what the trace shows: node time, relay)
            assert b"".join([x async for x in up.chunks()]) == got
            await up.aclose()

        await traced(Tracer(), f"00-{trace_id}-00f067aa0ba902b7-01", Sink(), traced_call)
        assert got.count(b"data: ") == 3 and PROMPT.encode() in got
        assert engine.bodies == [body(), body()]
        tp = engine.traceparents
        assert tp[0] is None and tp[1] is not None and tp[1].startswith(f"00-{trace_id}-")
        assert len(relayed_heads) == 2
        # A relay cannot tell the traced request from the untraced one by its headers: the
        # same names, and the sealed trace context has one length.
        shapes = [sorted((k, len(v)) for k, v in h if k != AUTH_HEADER.lower())
                  for h in relayed_heads]
        assert shapes[0] == shapes[1]
        # What crossed the relay, both ways: never the prompt, never the trace id.
        assert spy.sent and spy.received
        assert all(PROMPT.encode() not in b and trace_id.encode() not in b
                   for b in spy.sent + spy.received)
        assert all(trace_id not in repr(h) and "traceparent" not in repr(h)
                   for h in relayed_heads)


async def test_control_requests_must_be_signed_by_the_controller() -> None:
    engine = EchoEngine()
    assigned: list[str] = []
    prov, _dp = await _provider(engine, set(), assigned=assigned)
    ctl_key = NodeKey.generate()
    ctl = TlsTransport(ctl_key, adm(), TransportConfig(host=None))
    async with prov, ctl:
        await ctl.connect_bootstrap(prov.listen_addr)
        doc = b'{"model": "m"}'
        json_h = ("content-type", "application/json")

        async def post(headers: tuple[tuple[str, str], ...]) -> tuple[int, bytes]:
            resp = await ctl.request(prov.local_id, "POST", ASSIGN_PATH, headers, doc,
                                     timeout=5)
            async with resp:
                return resp.status, await resp.read()

        status, text = await post((json_h,))
        assert status == 401 and b"unsigned" in text
        other = NodeKey.generate()
        forged = sign_control(other, prov.local_id, ASSIGN_PATH, b'{"model": "other"}',
                              time.time())
        status, text = await post((json_h, (SIGNED_HEADER, forged)))
        assert status == 401 and b"bad_signature" in text
        signed = sign_control(ctl_key, prov.local_id, ASSIGN_PATH, doc, time.time())
        assert (await post((json_h, (SIGNED_HEADER, signed))))[0] == 202
        assert assigned == [ctl_key.peer_id]
        status, text = await post((json_h, (SIGNED_HEADER, signed)))  # replayed
        assert status == 401 and b"replayed" in text
        await asyncio.sleep(0)


async def test_session_exchanges_are_rate_limited_per_peer() -> None:
    engine = EchoEngine()
    prov, dp = await _provider(engine, set())
    dp.exchanges_per_min = 3
    ing_key = NodeKey.generate()
    ing = TlsTransport(ing_key, adm(), TransportConfig(host=None))
    async with prov, ing:
        await dp.start_https("127.0.0.1", 0)
        await ing.connect_bootstrap(prov.listen_addr)
        for _ in range(3):
            await DataPlaneSessions(ing_key, ing).get(prov.local_id, 5)
        with pytest.raises(UpstreamError, match="429"):
            await DataPlaneSessions(ing_key, ing).get(prov.local_id, 5)
        assert dp.refused == {"session_rate": 1}
        await dp.aclose()
