"""A lean HTTP/1.1 server for the OpenAI routes: asyncio.Protocol + httptools (llhttp).

It serves the same `Ingress.serve` core as the aiohttp routes, without aiohttp's per-request
machinery (request/headers objects, middlewares, router, response objects). Per connection:
keep-alive, pipelined requests answered in order one at a time, Content-Length and chunked
request bodies (400 `request_too_large` past `max_body_bytes`, then the connection closes),
streamed responses written chunk by chunk with chunked transfer encoding, TCP_NODELAY,
backpressure both ways (reading pauses while requests queue up; writers wait on the transport's
high-water mark), and an idle timeout. Known paths with another method answer 405; unknown
paths an OpenAI-shaped 404, or, with a `fallback` server (a fabric node's aiohttp app), the
connection is handed over to it (fast_routes.py): the bytes of that request and all that follow
go to the fallback's protocol, which serves the connection from then on. Only the headers the
core needs are kept (Authorization, or Anthropic's x-api-key when there is none; X-Fabric-
Providers, X-Session-Id, traceparent). /v1/responses, /v1/messages and the pass-through paths
go to the front's `ApiRoutes` over the ingress (llmfabric.apis); /openapi.json is the document
the front is given (`openapi_body`: apis/openapi.py, with the Batch API's routes where it is
mounted beside).

Hostile clients meet `FrontLimits` (front_limits.py): URL and head sizes (414/431), header and
body read timeouts (408, slowloris), connection caps per process and per client address (503;
over HTTPS counted from the TCP accept, and a handshake must end within a limit),
and the API key is checked when the head is complete, before any body is buffered
(key_precheck.py). Every header value we emit goes through `safe_header_value` (no CR/LF
from session ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl as ssl_module
import time
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools
import orjson

from llmfabric.apis.api_routes import EXTRA_POST_PATHS, ApiRoutes, to_anthropic
from llmfabric.apis.openapi import OPENAPI_BODY
from llmfabric.front.fast_routes import owned, route
from llmfabric.front.fast_wire import (
    FrontRequest,
    HeadCache,
    ResponseSink,
    Stop,
    reply_bytes,
    switch_protocol,
    too_many_connections,
)
from llmfabric.front.front_limits import ClientSlots, FrontLimits, KeyMemo, listen_args
from llmfabric.front.host_check import HostGuard
from llmfabric.front.key_precheck import KeyPrecheck
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, body_too_large, error_reply
from llmfabric.ingress.tracing import traced
from llmfabric.net.source_slots import peer_ip
from llmfabric.untrusted import get_logger, log_due

# Makes the protocol that serves a handed-over connection (aiohttp: `AppRunner.server`).
FallbackFactory = Callable[[], asyncio.Protocol]
log = get_logger(__name__)

# Pipelined requests buffered before reading pauses, or their bodies' bytes (one max-size
# body, at least 1 MiB): 32 bodies of 8 MiB behind an unread stream were 256 MiB.
_MAX_QUEUED = 32
_MAX_HEADER_VALUE = 16 * 1024


class FastFront:
    """Serves an `Ingress` (and optionally its /metrics) over a lean HTTP/1.1 server; with
    `fallback`, every other path goes to that server (see the module doc). `openapi_body`:
    the /openapi.json it serves."""

    def __init__(
        self, ingress: Ingress, *, serve_metrics: bool = True,
        idle_timeout_s: float | None = None, limits: FrontLimits | None = None,
        fallback: FallbackFactory | None = None, hosts: HostGuard | None = None,
        openapi_body: bytes = OPENAPI_BODY,
    ) -> None:
        limits = limits or FrontLimits()
        if idle_timeout_s is not None:
            limits = dataclasses.replace(limits, idle_timeout_s=idle_timeout_s)
        self.limits = limits
        self.ingress = ingress
        self.api = ApiRoutes(ingress)  # /v1/responses, /v1/messages, pass-through paths
        self.openapi_body = openapi_body
        self.serve_metrics = serve_metrics
        self.fallback = fallback
        # Host names answered, and the cross-site check (host_check.py); with API keys the
        # OpenAI routes are exempt (they need a key), so the fast path does no lookup.
        self.hosts = hosts if hosts is not None else HostGuard()
        self.keyed = ingress.auth is not None
        self.handed_over = 0  # connections given to the fallback server
        # Timers re-check each connection this often (a head or body stalled for its timeout
        # is closed within 1.5x of it; no timer work per request).
        self.check_period_s = min(limits.header_timeout_s, limits.body_timeout_s,
                                  limits.idle_timeout_s) / 2
        self.max_body = ingress.config.max_body_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self.slots = ClientSlots(limits)  # open connections per process and client address
        ingress.metrics.front_connections = self.slots.counts
        self.keys_seen = KeyMemo(limits)  # keys that pass the pre-body check at once
        self.key_check = KeyPrecheck(ingress, self.keys_seen)  # (key_precheck.py)
        # Response heads up to "Content-Length: " by (status, content type, node, model,
        # keep-alive).
        self._heads: HeadCache = {}

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048,
        ssl: ssl_module.SSLContext | None = None,
    ) -> int:
        """Listen on host:port (0 picks a port); returns the bound port. With `ssl`, serve
        HTTPS (reloading that context's certificate takes effect for new connections; how
        connections mid-handshake count: front_limits.py)."""
        loop = asyncio.get_running_loop()
        factory, tls = listen_args(loop, lambda: _Connection(self, loop), ssl, self.slots,
                                   self.limits.handshake_timeout_s)
        self._server = await loop.create_server(
            factory, host, port, reuse_port=reuse_port or None, backlog=backlog, **tls)
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and close every connection (in-flight requests are cut)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        for accepting in list(self.slots.handshaking):
            accepting.abort_handshake()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def refused_connections(self) -> int:
        """Connections refused at a cap (503 over HTTP; aborted at accept over HTTPS)."""
        return self.slots.refused

    def route(self, req: FrontRequest) -> tuple[str, bool] | Reply | None:
        """(path, streamable) for an OpenAI POST; a Reply for errors; None for GET routes."""
        return route(req.url.split(b"?", 1)[0], req.method, self.serve_metrics,
                     self.openapi_body)


class _Connection(asyncio.Protocol):
    def __init__(self, front: FastFront, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # (asyncio.get_running_loop() costs a getpid syscall on 3.11)
        self.front = front
        self.ingress = front.ingress
        self.max_body = front.max_body
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[FrontRequest] = deque()
        self.queued_bytes = 0  # body bytes of the requests in `queue`
        self.max_queued_bytes = max(self.max_body, 1 << 20)
        self.answered = False  # bytes of an answer to the request being served were sent
        self.cur: FrontRequest | None = None
        self.task: asyncio.Task[None] | None = None
        self.more: asyncio.Future[None] | None = None  # the idle task waits on this
        self.busy = False  # a request is being served
        self.parsing = True  # False after a fatal error: further bytes are ignored
        self.reading_paused = False
        self.drain: asyncio.Future[None] | None = None
        self.write_paused = False
        self.closed = False
        self.last_active = time.monotonic()
        self.idle_handle: asyncio.TimerHandle | None = None
        self.client = ""  # the client's IP address (per-client connection cap)
        self.counted = False  # holds a slot in the per-process and per-client counts
        self.in_head = False  # a request head is being received
        self.head_bytes = 0  # bytes received while in its head (after the first chunk)
        self.auth_paused = False  # reading paused for the pre-body key check
        # With a fallback: the bytes of the request being read, from its first byte (None:
        # not tracked, e.g. it began inside a read after another request), and whether the
        # current read began between two requests.
        self.raw: list[bytes] | None = None
        self.read_fresh = False
        self.handing: list[bytes] | None = None  # bytes for the fallback, once decided

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        front = self.front
        if not self.counted:  # (over HTTPS the slot was taken at accept: CountedTlsAccept)
            self.client = peer_ip(t)
            if not front.slots.take(self.client):
                # Over a cap (a flood): answer 503 and close without reading anything.
                self.parsing = False
                t.write(too_many_connections())
                t.close()
                return
            self.counted = True
        sock = t.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        front._conns.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # (the parser holds this connection: free the queued bodies now, serve none of them)
        self.queue.clear()
        self.queued_bytes = 0
        self.cur = None
        front = self.front
        front._conns.discard(self)
        if self.counted:
            self.counted = False
            front.slots.give_back(self.client)
        self._wake_runner()
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        if not self.parsing:
            if self.handing is not None:
                self.handing.append(data)
            return
        self.last_active = time.monotonic()
        if self.front.fallback is not None:
            self.read_fresh = fresh = self.cur is None
            if fresh:
                self.raw = [data]
            elif self.raw is not None:
                self.raw.append(data)
        if self.in_head:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported", "unsupported_upgrade")
        except httptools.HttpParserCallbackError as e:
            if not isinstance(e.__context__, Stop):
                self._fail(400, f"malformed HTTP request: {e}", "bad_request")
        except httptools.HttpParserError as e:
            self._fail(400, f"malformed HTTP request: {e}", "bad_request")
        else:
            # A head that keeps coming (a huge header httptools would accumulate): the count
            # is exact up to the chunk the head began in (at most one read more).
            if self.in_head and self.head_bytes > self.front.limits.max_head_bytes:
                self._fail(431, "the request head is larger than "
                           f"{self.front.limits.max_head_bytes} bytes",
                           "request_header_fields_too_large")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self.parsing:
            raise Stop
        self.cur = FrontRequest(time.monotonic())
        self.in_head = True
        self.head_bytes = 0
        if not self.read_fresh:
            self.raw = None  # began inside a read: its first byte is unknown
        self.read_fresh = False

    def on_url(self, url: bytes) -> None:
        cur = self.cur
        if cur is not None:
            cur.url += url
            if len(cur.url) > self.front.limits.max_url_bytes:
                self._fail(414, "the request URL is longer than "
                           f"{self.front.limits.max_url_bytes} bytes", "uri_too_long")
                raise Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        cur = self.cur
        if cur is None:
            return
        cur.headers += 1
        cur.size += len(name) + len(value) + 4
        lim = self.front.limits
        if cur.headers > lim.max_headers or cur.size + len(cur.url) > lim.max_head_bytes:
            self._fail(431, f"the request head has more than {lim.max_headers} fields or "
                       f"{lim.max_head_bytes} bytes", "request_header_fields_too_large")
            raise Stop
        cur.keep_header(name.lower(), value, self.max_body)

    def on_headers_complete(self) -> None:
        cur = self.cur
        self.in_head = False
        if cur is None:
            return
        p = self.parser
        cur.method = p.get_method()
        cur.keep_alive = p.should_keep_alive()
        cur.version = p.get_http_version()
        cur.head_done = True
        if self.front.fallback is not None:
            if not owned(cur.url.split(b"?", 1)[0], self.front.serve_metrics):
                self._hand_over_later(cur)
                raise Stop
            self.raw = None
        too_large = cur.body == b"!"  # a declared Content-Length over the limit
        cur.body = b""
        cur.size = 0  # from here on: body bytes
        if len(cur.auth) > _MAX_HEADER_VALUE:
            cur.auth = ""
        if too_large:
            self._too_large(cur)
            return
        if (self.ingress.auth is not None and cur.method == b"POST"
                and not self.front.key_check.begin(self, cur)):
            return
        if cur.expect and not cur.auth_wait:
            self.send_continue()

    def _hand_over_later(self, cur: FrontRequest) -> None:
        """Queue the hand-over of this connection to the fallback server (after the answers
        to the requests before this one); from here on bytes are kept, not parsed."""
        self.parsing = False
        self.cur = None
        if self.raw is None:  # pipelined inside one read behind another request
            cur.error = error_reply(400, "send requests to paths other than the OpenAI API "
                                    "on a new connection", "bad_request")
            cur.close = True
        else:
            self.handing, self.raw = self.raw, None
            cur.hand_over = True
        self._enqueue(cur)

    def _hand_over(self) -> None:
        """Give the connection, with every byte from the request on, to a new protocol of
        the fallback server; this one lets go of it."""
        t, factory, data = self.transport, self.front.fallback, self.handing
        self.handing = None
        if t is None or factory is None or data is None or self.closed:
            return
        self.connection_lost(None)  # (our bookkeeping; asyncio will not call it any more)
        self.front.handed_over += 1
        switch_protocol(t, factory(), data, self.reading_paused or self.auth_paused)

    def send_continue(self) -> None:
        """100 Continue for the request being read (sent only once its key is known valid)."""
        if not self.busy and not self.queue and self.transport and not self.closed:
            # curl sends this for larger bodies; nothing else is pending, so it cannot
            # interleave with another response.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def refuse_early(self, cur: FrontRequest, reply: Reply) -> None:
        """Answer `cur` with `reply` (in turn); read nothing more, and close after."""
        cur.parts = []
        cur.error = reply
        cur.close = True
        self.cur = None
        self.parsing = False
        self._enqueue(cur)

    def pause_for_auth(self, pause: bool) -> None:
        t = self.transport
        if t is None or self.closed or pause == self.auth_paused:
            return
        self.auth_paused = pause
        if pause and not self.reading_paused:
            t.pause_reading()
        elif not pause and not self.reading_paused:
            t.resume_reading()

    def _too_large(self, cur: FrontRequest) -> None:
        """Answer 400 now; the rest of the body is discarded and the connection closes."""
        self.refuse_early(cur, body_too_large(self.max_body))

    def on_body(self, body: bytes) -> None:
        cur = self.cur
        if cur is None or cur.error is not None:
            return
        cur.size += len(body)
        if cur.size > self.max_body:
            self._too_large(cur)
            return
        cur.parts.append(body)

    def on_message_complete(self) -> None:
        cur, self.cur = self.cur, None
        if cur is None:
            return
        parts = cur.parts
        if parts:
            cur.body = parts[0] if len(parts) == 1 else b"".join(parts)
            cur.parts = []
        self._enqueue(cur)

    # -- request handling ----------------------------------------------------------------

    def _fail(self, status: int, message: str, code: str) -> None:
        req = FrontRequest()
        if self.cur is not None:
            req.url = self.cur.url  # (the API's error shape: Anthropic's on /v1/messages)
        self.refuse_early(req, error_reply(status, message, code))

    def _enqueue(self, req: FrontRequest) -> None:
        if self.closed:
            return
        self.queue.append(req)
        self.queued_bytes += len(req.body)
        if self.task is None:
            self.task = self.loop.create_task(self._run())
        elif self.more is not None:
            self._wake_runner()
        elif ((len(self.queue) >= _MAX_QUEUED or self.queued_bytes >= self.max_queued_bytes)
              and not self.reading_paused and self.transport):
            self.reading_paused = True
            if not self.auth_paused:
                self.transport.pause_reading()

    def _wake_runner(self) -> None:
        more, self.more = self.more, None
        if more is not None and not more.done():
            more.set_result(None)

    async def _run(self) -> None:
        """One task per connection for its whole life: serves queued requests in order,
        then waits for the next one (cheaper than a task per request)."""
        try:
            while not self.closed:
                if not self.queue:
                    self.busy = False
                    self.last_active = time.monotonic()
                    self.more = self.loop.create_future()
                    await self.more
                    continue
                self.busy = True
                req = self.queue.popleft()
                self.queued_bytes -= len(req.body)
                if (self.reading_paused and len(self.queue) < _MAX_QUEUED // 2
                        and self.queued_bytes < self.max_queued_bytes // 2):
                    self.reading_paused = False
                    if self.transport is not None and not self.auth_paused:
                        self.transport.resume_reading()
                if req.hand_over:
                    self._hand_over()
                    return
                self.answered = False
                keep = await self._serve(req)
                if not keep:
                    self._close()
                    return
        except Exception as exc:  # a bug must not leave a client hanging, nor go unseen
            self._internal_error(exc)
        finally:
            self.task = None
            self.busy = False
            self.last_active = time.monotonic()

    async def _serve(self, req: FrontRequest) -> bool:
        keep = req.keep_alive and not req.close
        if req.error is not None:
            err = orjson.loads(req.error.body).get("error", {})
            self.ingress.metrics.observe_error("", req.error.status, str(err.get("code")))
            self._send(self._for_api(req, req.error), False, head_only=False)
            self._linger_close()
            return True  # (closing already)
        head_only = req.method == b"HEAD"
        front = self.front
        if not front.keyed or (req.url.startswith(b"/metrics")
                               and req.url.split(b"?", 1)[0] == b"/metrics"):
            # (with API keys the front's other routes need a key, or serve nothing private)
            refused = front.hosts.refusal(req.host, req.method, req.origin, req.fetch_site,
                                          False)
            if refused is not None:
                self._send(self._for_api(req, refused), keep, head_only)
                return keep
        hit = front.route(req)
        if isinstance(hit, Reply):
            self._send(self._for_api(req, hit), keep, head_only)
            return keep
        if hit is None:
            if req.url.split(b"?", 1)[0] == b"/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                reply = Reply(200, self.ingress.metrics.render(), CONTENT_TYPE_LATEST)
            else:
                reply = await self.ingress.models_reply(req.auth)
            self._send(reply, keep, head_only)
            return keep
        path, streamable = hit
        sink = ResponseSink(self, chunked=req.version != "1.0")
        ing, api = self.ingress, self.front.api  # (api: translated APIs and pass-through)
        a, p, b, s = req.auth, req.providers, req.body, req.session_id
        call = ((lambda: api.serve(path, a, p, b, sink, s)) if path in EXTRA_POST_PATHS
                else (lambda: ing.serve(path, streamable, a, p, b, sink, s)))
        out = await traced(ing.tracer, req.traceparent, sink, call)
        if out is not None:
            self._send(out, keep, False)
            return keep
        return keep and sink.chunked and sink.complete

    @staticmethod
    def _for_api(req: FrontRequest, reply: Reply) -> Reply:
        """An error the front answers itself (refused before the body, a wrong method or
        path), in the shape of the API called: Anthropic's under /v1/messages."""
        return to_anthropic(reply) if reply.status >= 400 and req.url.startswith(
            b"/v1/messages") else reply

    def _internal_error(self, exc: Exception) -> None:
        """A bug while serving: counted, and logged at the 1st, 2nd, 4th... time; the client
        gets a JSON 500 when nothing of an answer was sent yet (else the connection is cut:
        the answer is broken)."""
        metrics = self.ingress.metrics
        metrics.observe_error("", 500, "internal_error")
        n = metrics.errors.get(("500", "internal_error"), 0)  # (counted only here)
        if log_due(n):  # (a client can repeat a request that hits the bug: no log flood)
            log.error("front: serving a request from %s failed: %r; %d internal error(s) so "
                      "far (llmfabric_ingress_errors{code=internal_error})", self.client or "?",
                      exc, n, exc_info=exc if n == 1 else None)
        if not self.answered:  # (_send and _linger_close do nothing once it closed)
            self._send(error_reply(500, "internal error; the ingress logged it",
                                   "internal_error"), False, False)
            self._linger_close()
        elif self.transport is not None:
            self.transport.abort()

    def _send(self, reply: Reply, keep: bool, head_only: bool) -> None:
        t = self.transport
        if t is not None and not self.closed:
            self.answered = True
            t.write(reply_bytes(self.front._heads, reply, keep, head_only))

    def _close(self) -> None:
        t = self.transport
        if t is not None and not self.closed:
            t.close()

    def _linger_close(self) -> None:
        """After an error answer: send FIN, discard what the client still sends, close soon
        (closing with unread input would reset the connection and could lose the answer)."""
        t = self.transport
        if t is None or self.closed:
            return
        self.parsing = False
        if t.can_write_eof():
            t.write_eof()
            self.loop.call_later(2.0, t.close)
        else:
            t.close()

    def abort(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _wake_writer(self) -> None:
        d, self.drain = self.drain, None
        if d is not None and not d.done():
            d.set_result(None)

    async def wait_writable(self) -> None:
        if self.write_paused and not self.closed:
            self.drain = self.loop.create_future()
            await self.drain
        if self.closed:
            raise ConnectionResetError("the client closed the connection")

    # -- idle timeout --------------------------------------------------------------------

    def _arm_idle(self) -> None:
        self.idle_handle = self.loop.call_later(self.front.check_period_s, self._check_idle)

    def _check_idle(self) -> None:
        """Keep-alive idle, header and body read timeouts (one periodic timer per connection)."""
        if self.closed:
            return
        now = time.monotonic()
        lim = self.front.limits
        cur = self.cur
        if cur is not None and self.parsing and not (self.reading_paused or self.auth_paused):
            # (while we are the ones not reading, the client cannot be slow)
            why = lim.overdue(now, cur.head_done, cur.started, self.last_active)
            if why is not None:
                self._fail(408, why, "request_timeout")
                return
        elif not self.busy and not self.queue and now - self.last_active >= lim.idle_timeout_s:
            self._close()
            return
        self._arm_idle()
