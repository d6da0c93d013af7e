"""The provider side of the data plane (llmfabric.dataplane): session exchange, the pinned
HTTPS listener for the direct path, and sealed requests over the peer network.

- `POST /_fabric/v1/forward-session` (peer protocol): answers the ingress's signed offer.
  The ingress's identity is the key that signed the offer; it must be the authenticated
  peer of the connection, or (through a relay, whose origin header proves nothing) a member
  the registry knows.
- HTTPS (`start_https`): TLS with this node's own certificate (the ingress pins our peer
  id), serving `POST /v1/fabric/forward/v1/...` with a valid `X-Fabric-Auth` only. Every
  accepted connection has TCP keepalive and TCP_USER_TIMEOUT on (net/tcp_keepalive.py, the
  ingress's settings): an ingress that vanished without FIN or RST is noticed after
  `keepalive.dead_after_s` of silence, and a connection that is lost cancels its request's
  handler, which closes the engine request (the engine stops generating for nobody).
  Connections are capped (in all and per IP address) from TCP accept until their first
  authorized request: a flood of silent or unauthorized connections is refused at accept.
- Peer requests under the forward prefix: the authorization checked, the body unsealed,
  the engine's answer returned as sealed frames.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable

from aiohttp import web

from llmfabric.dataplane.authz import AUTH_HEADER, AuthzError, ProviderSessions
from llmfabric.dataplane.exchange import MAX_MESSAGE, ExchangeError, answer
from llmfabric.dataplane.sealing import (
    DATA,
    END,
    SEALED_TYPE,
    TRACE_HEADER,
    Sealer,
    open_body,
    open_trace,
)
from llmfabric.identity import NodeKey
from llmfabric.identity.certs import make_self_signed_cert
from llmfabric.ingress.errors import error_response as http_error
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.errors import BodyTooLarge
from llmfabric.net.handshake import server_ssl_context
from llmfabric.net.source_slots import HeldSlot, SourceSlots
from llmfabric.net.tcp_keepalive import KeepAlive, start_watched_server
from llmfabric.node.engine_link import ClosingStream, EngineLink, error_response
from llmfabric.telemetry.node_hop import NODE_TIME_HEADER

_MSGPACK = (("content-type", "application/msgpack"),)
_FRAME_DATA = 1024 * 1024  # plaintext bytes per sealed frame at most
# Accepted -> TLS handshake done, on the HTTPS listener (asyncio's default is 60 s). An
# ingress completes it in milliseconds (a few RTTs even across sites); keepalive cannot catch
# a client that is alive but silent, so this is what frees its socket and TLS buffers.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Connections not yet proven at once (TCP accept until their first authorized request: TLS
# is the first half of that handshake, a valid X-Fabric-Auth the second), in all and from
# one IP address, as the peer listener's (net/config.py): over either cap a connection is
# closed at TCP accept and counted (refused["busy"]), so a flood of silent connections, or
# of connections that complete TLS and then idle (closed UNPROVEN_TIMEOUT_S after TLS;
# aiohttp's own keep-alive limit is an hour), cannot hold sockets up to the file limit, nor
# the slots for long. Honest ingresses stay far under
# it: each dials one provider at most `RawHttpForwarder(max_dials_per_node=32)` connections
# at a time (forward/dial_gate.py) and sends a request on each at once.
MAX_HANDSHAKES, MAX_HANDSHAKES_PER_IP = 256, 128
# TLS done -> first authorized request: an ingress sends one at once on a connection it
# dialled (its body, 1 MiB at most, takes a second on a slow WAN link), so a connection
# still unproven after this is closed (refused["unproven_timeout"]) and its slot returns.
UNPROVEN_TIMEOUT_S = 15.0


class DataPlaneServer:
    def __init__(
        self,
        key: NodeKey,
        engine: Callable[[], EngineLink | None],
        is_member: Callable[[str], bool],
        *,
        max_body_bytes: int,
        now: Callable[[], float] = time.time,
        session_ttl_s: float = 3600.0,
        keepalive: KeepAlive | None = None,
        tls_handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
        max_handshakes: int | None = MAX_HANDSHAKES,
        max_handshakes_per_ip: int | None = MAX_HANDSHAKES_PER_IP,
        unproven_timeout_s: float = UNPROVEN_TIMEOUT_S,
    ) -> None:
        self.key = key
        self.sessions = ProviderSessions()
        self._engine = engine
        self._is_member = is_member
        self._max_body = max_body_bytes
        self._now = now
        self._ttl = session_ttl_s
        self.keepalive = keepalive or KeepAlive()
        self.tls_handshake_timeout_s = tls_handshake_timeout_s
        self.https_port = 0
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.refused: dict[str, int] = {}  # refusals by code (metrics, tests)
        # connections on the HTTPS listener before their first authorized request (the TLS
        # handshake included); `_unproven` holds the slots of those past TLS
        self.handshaking = SourceSlots(max_handshakes, max_handshakes_per_ip,
                                       on_refused=lambda: self._count_refusal("busy"))
        self._unproven: dict[asyncio.BaseTransport, HeldSlot] = {}
        self.unproven_timeout_s = unproven_timeout_s
        self._deadlines: dict[asyncio.BaseTransport, asyncio.TimerHandle] = {}
        self.served: dict[str, int] = {"https": 0, "sealed": 0}  # authorized requests by path
        # Session exchanges cost ~1 ms CPU: at most `exchanges_per_min` per peer and minute
        # (an ingress needs one per hour; a provider restart costs one more).
        self.exchanges_per_min = 20
        self._exchanges: dict[str, tuple[float, int]] = {}  # peer -> (window start, count)

    # -- SlotKeeper: a connection's slot is held until its first authorized request --------

    def keep(self, transport: asyncio.BaseTransport, slot: HeldSlot) -> None:
        self._unproven[transport] = slot
        self._deadlines[transport] = asyncio.get_running_loop().call_later(
            self.unproven_timeout_s, self._expire, transport)

    def forget(self, transport: asyncio.BaseTransport) -> None:
        self._settle(transport)  # (the TLS layer gives its slot back as it closes)

    def _settle(self, transport: asyncio.BaseTransport) -> HeldSlot | None:
        """`transport` is no longer unproven (closed, or proven): no deadline any more, and
        its slot, if it still held one."""
        deadline = self._deadlines.pop(transport, None)
        if deadline is not None:
            deadline.cancel()
        return self._unproven.pop(transport, None)

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        """Still unproven at its deadline: closed (its slot comes back as it closes)."""
        self._deadlines.pop(transport, None)
        if transport in self._unproven:
            self._count_refusal("unproven_timeout")
            if isinstance(transport, asyncio.Transport):
                transport.abort()
            else:
                transport.close()

    def _proven(self, request: web.Request) -> None:
        slot = self._settle(request.transport) if request.transport is not None else None
        if slot is not None:
            slot.release()

    def _refuse(self, exc: AuthzError) -> None:
        self._count_refusal(exc.code)

    def _count_refusal(self, code: str) -> None:
        self.refused[code] = self.refused.get(code, 0) + 1

    # -- session exchange (peer protocol) --------------------------------------------------

    def _exchange_allowed(self, key: str) -> bool:
        now = self._now()
        start, count = self._exchanges.get(key, (now, 0))
        if now - start >= 60.0:
            start, count = now, 0
        if count >= self.exchanges_per_min:
            return False
        if len(self._exchanges) > 10_000:
            self._exchanges.clear()
        self._exchanges[key] = (start, count + 1)
        return True

    async def handle_session(self, request: PeerRequest) -> HandlerResponse:
        try:
            body = await request.read(MAX_MESSAGE)
        except BodyTooLarge:  # (the stream is reset: the sender stops at its window)
            return error_response(400, "session offer too large", "request_too_large")
        # Counted per requesting peer before any signature work (through a relay: the origin
        # the relay names; a lying relay can spread its own exchanges over invented names,
        # but it is an admitted member, and the per-peer session cap still holds).
        if not self._exchange_allowed(request.peer_id):
            self._refuse(AuthzError("session_rate", ""))
            return error_response(429, "too many data-plane session exchanges; retry in a "
                                  "minute", "session_rate")
        try:
            reply, session = answer(self.key, body, self._now(), ttl_s=self._ttl,
                                    https_port=self.https_port)
        except ExchangeError as exc:
            return error_response(400, f"bad session offer: {exc}", "bad_session_offer")
        direct = request.via is None and request.peer_id == session.peer_id
        if not direct and not self._is_member(session.peer_id):
            return error_response(403, "the offer's signer is not a member we know",
                                  "not_a_member")
        self.sessions.add(session)
        return HandlerResponse(200, _MSGPACK, reply)

    # -- sealed requests over the peer network ---------------------------------------------

    async def handle_sealed(self, request: PeerRequest) -> HandlerResponse:
        engine = self._engine()
        if engine is None:
            return error_response(503, "this node serves no engine", "node_not_serving")
        try:
            sealed = await request.read(self._max_body + 64)
        except BodyTooLarge:
            return error_response(400, "request body too large", "request_too_large")
        header = request.header(AUTH_HEADER.lower()) or ""
        path = request.path.encode()
        try:
            ok = self.sessions.verify(header, path, b"", self._now())
            prefix = header[: header.rindex(".")].encode()
            aad = prefix + b"\n" + path
            body = open_body(ok.session.key, ok.rid, aad, sealed)
            trace = request.header(TRACE_HEADER)
            # (sealed, so a relay sees no trace id; a plain `traceparent` comes only from an
            # ingress older than sealed trace context)
            traceparent = (open_trace(ok.session.key, ok.rid, aad, trace) if trace is not None
                           else request.header("traceparent"))
        except AuthzError as exc:
            self._refuse(exc)
            return error_response(401, str(exc), exc.code)
        self.served["sealed"] += 1
        resp = await engine.serve_body(request.path, body, traceparent)
        sealer = Sealer(ok.session.key, ok.rid)
        status = resp.status
        ctype = next((v for k, v in resp.headers if k.lower() == "content-type"),
                     "application/json")
        inner = resp.body

        async def frames() -> AsyncGenerator[bytes, None]:
            yield sealer.head(status, ctype)
            if isinstance(inner, bytes):
                for i in range(0, len(inner), _FRAME_DATA):
                    yield sealer.frame(DATA, inner[i : i + _FRAME_DATA])
            else:
                async for chunk in inner:
                    for i in range(0, len(chunk), _FRAME_DATA):  # (frames stay < MAX_FRAME)
                        yield sealer.frame(DATA, chunk[i : i + _FRAME_DATA])
            yield sealer.frame(END, b"")

        out = frames()

        async def close() -> None:
            # Closed before or right after its first frame, `frames` never started on
            # `inner`, and a generator's `finally` does not run unless it started: `inner`
            # (the engine connection, the in-flight count) is closed here too.
            try:
                await out.aclose()
            finally:
                aclose = getattr(inner, "aclose", None)
                if aclose is not None:
                    await aclose()

        timed = tuple((k, v) for k, v in resp.headers if k == NODE_TIME_HEADER.lower())
        return HandlerResponse(200, (("content-type", SEALED_TYPE), *timed),
                               ClosingStream(out, close))

    # -- the pinned HTTPS listener (direct path) -------------------------------------------

    def _unproven_error(self, request: web.Request, resp: web.Response) -> web.Response:
        """`resp`, closing the connection after it when no request on it was authorized yet:
        an unproven connection holds a handshake slot, so one that fails (a forged header, an
        expired session, a node without engine) gives the slot back rather than idle in a
        client's pool; an honest ingress redials with a fresh TLS handshake."""
        if request.transport in self._unproven:
            resp.force_close()
        return resp

    async def handle_https(self, request: web.Request) -> web.StreamResponse:
        engine = self._engine()
        if engine is None:
            return self._unproven_error(
                request, http_error(503, "this node serves no engine", "node_not_serving"))
        if request.content_length is not None and request.content_length > self._max_body:
            return self._unproven_error(
                request, http_error(400, "request body too large", "request_too_large"))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # (chunked: no Content-Length to check first)
            return self._unproven_error(
                request, http_error(400, "request body too large", "request_too_large"))
        try:
            self.sessions.verify(request.headers.get(AUTH_HEADER, ""),
                                 request.raw_path.encode(), body, self._now())
        except AuthzError as exc:
            self._refuse(exc)
            return self._unproven_error(request, http_error(401, str(exc), exc.code))
        self._proven(request)
        self.served["https"] += 1
        return await engine.handle_http(request)

    async def start_https(self, host: str, port: int) -> int:
        app = web.Application(client_max_size=self._max_body + 1)
        app.router.add_post(FORWARD_PREFIX + "/v1/{tail:.+}", self.handle_https)
        # handler_cancellation: a lost connection (the ingress closed, or keepalive found it
        # dead) cancels its handler at once, not at the next token it would write; the
        # engine proxy's cleanup then closes the engine request.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await self._runner.setup()
        assert self._runner.server is not None  # (set by setup())
        ctx = server_ssl_context(self.key, make_self_signed_cert(self.key))
        self._listener = await start_watched_server(
            self._runner.server, host, port, self.keepalive, ssl_context=ctx,
            ssl_handshake_timeout=self.tls_handshake_timeout_s, handshake_slots=self.handshaking,
            slot_keeper=self,
        )
        self.https_port = int(self._listener.sockets[0].getsockname()[1])
        return self.https_port

    async def aclose(self) -> None:
        if self._listener is not None:  # no new connections, then the open ones end
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
