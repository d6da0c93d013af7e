"""A lean HTTP/1.1 server for the OpenAI routes: asyncio.Protocol + httptools (llhttp).

It serves the same `Ingress.serve` core as the aiohttp routes, without aiohttp's per-request
machinery (request/headers objects, middlewares, router, response objects). Per connection:
keep-alive, pipelined requests answered in order one at a time, Content-Length and chunked
request bodies (400 `request_too_large` past `max_body_bytes`, then the connection closes),
streamed responses written chunk by chunk with chunked transfer encoding, TCP_NODELAY,
backpressure both ways (reading pauses while requests queue up; writers wait on the
transport's high-water mark), and an idle timeout. Unknown paths answer an OpenAI-shaped 404,
known paths with another method 405. Only the headers the core needs are kept
(Authorization, X-Fabric-Providers).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from typing import cast

import httptools
import orjson

from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, error_reply

_POST_ROUTES = {
    b"/v1/chat/completions": ("/v1/chat/completions", True),
    b"/v1/completions": ("/v1/completions", True),
    b"/v1/embeddings": ("/v1/embeddings", False),
}
_REASONS = {
    200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
    404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout",
    413: b"Payload Too Large", 429: b"Too Many Requests", 500: b"Internal Server Error",
    502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout",
}
_MAX_QUEUED = 32  # pipelined requests buffered before reading pauses
_MAX_HEADER_VALUE = 16 * 1024


class _Request:
    __slots__ = ("auth", "body", "close", "error", "expect", "keep_alive", "method", "parts",
                 "providers", "size", "url", "version")

    def __init__(self) -> None:
        self.url = b""
        self.method = b""
        self.auth = ""
        self.providers: str | None = None
        self.parts: list[bytes] = []
        self.body = b""
        self.size = 0
        self.keep_alive = True
        self.version = "1.1"
        self.error: Reply | None = None  # answer this instead, then close
        self.close = False
        self.expect = False  # Expect: 100-continue


class FastFront:
    """Serves an `Ingress` (and optionally its /metrics) over a lean HTTP/1.1 server."""

    def __init__(
        self, ingress: Ingress, *, serve_metrics: bool = True, idle_timeout_s: float = 75.0
    ) -> None:
        self.ingress = ingress
        self.serve_metrics = serve_metrics
        self.idle_timeout_s = idle_timeout_s
        self.max_body = ingress.config.max_body_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        # Response heads up to "Content-Length: " by (status, content type, node, keep-alive).
        self._heads: dict[tuple[int, str, str, bool], bytes] = {}

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 2048
    ) -> int:
        """Listen on host:port (0 picks a port); returns the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, loop), host, port, reuse_port=reuse_port or None,
            backlog=backlog,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and close every connection (in-flight requests are cut)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def route(self, req: _Request) -> tuple[str, bool] | Reply | None:
        """(path, streamable) for an OpenAI POST; a Reply for errors; None for GET routes."""
        path = req.url.split(b"?", 1)[0]
        method = req.method
        hit = _POST_ROUTES.get(path)
        if hit is not None:
            if method == b"POST":
                return hit
            return _not_allowed(path, "POST")
        if path == b"/v1/models" or (path == b"/metrics" and self.serve_metrics):
            return None if method == b"GET" else _not_allowed(path, "GET")
        return error_reply(404, f"no route {path.decode('latin-1')!r}; the API is under /v1 "
                           "(chat/completions, completions, embeddings, models)", "not_found")


def _not_allowed(path: bytes, allow: str) -> Reply:
    return error_reply(405, f"{path.decode('latin-1')} accepts {allow} only",
                       "method_not_allowed", headers={"Allow": allow})


def _head(status: int, content_type: str, node: str, extra: dict[str, str] | None,
          close: bool) -> bytearray:
    out = bytearray(b"HTTP/1.1 %d %s\r\nContent-Type: " % (status, _REASONS.get(status, b"OK")))
    out += content_type.encode("latin-1")
    if node:
        out += b"\r\nX-Fabric-Node: " + node.encode("latin-1")
    if extra:
        for k, v in extra.items():
            out += b"\r\n" + k.encode("latin-1") + b": " + v.encode("latin-1")
    if close:
        out += b"\r\nConnection: close"
    return out


class _Connection(asyncio.Protocol):
    def __init__(self, front: FastFront, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # (asyncio.get_running_loop() costs a getpid syscall on 3.11)
        self.front = front
        self.ingress = front.ingress
        self.max_body = front.max_body
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[_Request] = deque()
        self.cur: _Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.more: asyncio.Future[None] | None = None  # the idle task waits on this
        self.busy = False  # a request is being served
        self.header_name = b""
        self.parsing = True  # False after a fatal error: further bytes are ignored
        self.reading_paused = False
        self.drain: asyncio.Future[None] | None = None
        self.write_paused = False
        self.closed = False
        self.last_active = time.monotonic()
        self.idle_handle: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.front._conns.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front._conns.discard(self)
        self._wake_runner()
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        if not self.parsing:
            return
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported", "unsupported_upgrade")
        except httptools.HttpParserError as e:
            self._fail(400, f"malformed HTTP request: {e}", "bad_request")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.cur = _Request()

    def on_url(self, url: bytes) -> None:
        if self.cur is not None:
            self.cur.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        cur = self.cur
        if cur is None:
            return
        n = name.lower()
        if n == b"authorization":
            cur.auth = value.decode("latin-1")
        elif n == b"x-fabric-providers":
            cur.providers = value.decode("latin-1")
        elif n == b"expect":
            cur.expect = value.lower() == b"100-continue"
        elif n == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = 0  # llhttp rejects it
            if declared > self.max_body:
                cur.size = declared  # refused in on_headers_complete

    def on_headers_complete(self) -> None:
        cur = self.cur
        if cur is None:
            return
        p = self.parser
        cur.method = p.get_method()
        cur.keep_alive = p.should_keep_alive()
        cur.version = p.get_http_version()
        if len(cur.auth) > _MAX_HEADER_VALUE:
            cur.auth = ""
        if cur.size > self.max_body:  # a declared Content-Length over the limit
            self._too_large(cur)
        elif cur.expect and not self.busy and not self.queue and self.transport:
            # curl sends this for larger bodies; nothing else is pending, so it cannot
            # interleave with another response.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _too_large(self, cur: _Request) -> None:
        """Answer 400 now; the rest of the body is discarded and the connection closes."""
        cur.parts = []
        cur.error = self.ingress._too_large(self.max_body)
        cur.close = True
        self.cur = None
        self.parsing = False
        self._enqueue(cur)

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
        self.parsing = False
        req = _Request()
        req.error = error_reply(status, message, code)
        req.close = True
        self.cur = None
        self._enqueue(req)

    def _enqueue(self, req: _Request) -> None:
        self.queue.append(req)
        if self.task is None:
            self.task = self.loop.create_task(self._run())
        elif self.more is not None:
            self._wake_runner()
        elif len(self.queue) >= _MAX_QUEUED and not self.reading_paused and self.transport:
            self.reading_paused = True
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
                if self.reading_paused and len(self.queue) < _MAX_QUEUED // 2:
                    self.reading_paused = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                keep = await self._serve(req)
                if not keep:
                    self._close()
                    return
        except Exception:  # a bug must not leave a client hanging
            if self.transport is not None:
                self.transport.abort()
        finally:
            self.task = None
            self.busy = False
            self.last_active = time.monotonic()

    async def _serve(self, req: _Request) -> bool:
        keep = req.keep_alive and not req.close
        if req.error is not None:
            err = orjson.loads(req.error.body).get("error", {})
            self.ingress.metrics.observe_error("", req.error.status, str(err.get("code")))
            self._send(req.error, False, head_only=False)
            self._linger_close()
            return True  # (closing already)
        head_only = req.method == b"HEAD"
        hit = self.front.route(req)
        if isinstance(hit, Reply):
            self._send(hit, keep, head_only)
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
        sink = _Sink(self, chunked=req.version != "1.0")
        out = await self.ingress.serve(path, streamable, req.auth, req.providers, req.body, sink)
        if out is not None:
            self._send(out, keep, False)
            return keep
        return keep and sink.chunked and sink.complete

    def _send(self, reply: Reply, keep: bool, head_only: bool) -> None:
        t = self.transport
        if t is None or self.closed:
            return
        if reply.headers:
            head = bytes(_head(reply.status, reply.content_type, reply.node, reply.headers,
                               not keep) + b"\r\nContent-Length: ")
        else:
            heads = self.front._heads
            key = (reply.status, reply.content_type, reply.node, keep)
            cached = heads.get(key)
            if cached is None:
                if len(heads) > 1024:
                    heads.clear()
                cached = heads[key] = bytes(
                    _head(reply.status, reply.content_type, reply.node, None, not keep)
                    + b"\r\nContent-Length: ")
            head = cached
        t.write(b"%b%d\r\n\r\n%b" % (head, len(reply.body), b"" if head_only else reply.body))

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
        self.idle_handle = self.loop.call_later(
            self.front.idle_timeout_s, self._check_idle
        )

    def _check_idle(self) -> None:
        if self.closed:
            return
        idle_for = time.monotonic() - self.last_active
        if not self.busy and not self.queue and idle_for >= self.front.idle_timeout_s:
            self._close()
            return
        self._arm_idle()


class _Sink:
    """StreamSink writing a chunked (HTTP/1.1) or close-delimited (HTTP/1.0) response.

    The response head waits for the first body bytes so that both leave in one write (one
    syscall and one segment fewer before the first token)."""

    __slots__ = ("chunked", "complete", "conn", "head")

    def __init__(self, conn: _Connection, chunked: bool) -> None:
        self.conn = conn
        self.chunked = chunked
        self.complete = False
        self.head = b""

    def _transport(self) -> asyncio.Transport:
        c = self.conn
        if c.closed or c.transport is None:
            raise ConnectionResetError("the client closed the connection")
        return c.transport

    async def start(self, content_type: str, node: str) -> None:
        self._transport()
        out = _head(200, content_type, node, None, not self.chunked)
        out += (b"\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                if self.chunked else b"\r\nCache-Control: no-cache\r\n\r\n")
        self.head = bytes(out)

    async def write(self, data: bytes) -> None:
        if not self.write_now(data):
            await self.conn.wait_writable()

    def write_now(self, data: bytes) -> bool:
        """Write without waiting; False when the client's buffer is over its high-water mark
        (then await `wait_writable()` before writing more)."""
        t = self._transport()
        if not data:  # (an empty chunk would end the chunked body)
            return not self.conn.write_paused
        if self.chunked:
            data = b"%b%x\r\n%b\r\n" % (self.head, len(data), data)
        elif self.head:
            data = self.head + data
        self.head = b""
        t.write(data)
        return not self.conn.write_paused

    async def wait_writable(self) -> None:
        await self.conn.wait_writable()

    async def end(self) -> None:
        t = self._transport()
        if self.chunked:
            t.write(self.head + b"0\r\n\r\n")
        elif self.head:
            t.write(self.head)
        self.head = b""
        self.complete = True
