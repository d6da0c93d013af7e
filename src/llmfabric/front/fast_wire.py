"""The lean front's (fast_front.py) wire pieces: `FrontRequest`, what it keeps of a request
while reading it, and `Stop`; the response bytes: `response_head` (status line and the headers
we emit, each through `safe_header_value`: no CR/LF from session ids), `reply_bytes` and
`ResponseSink`, the StreamSink writing a chunked (HTTP/1.1) or close-delimited (HTTP/1.0)
response on a front connection; `not_allowed` (405 with Allow)."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Protocol

from llmfabric.front.front_limits import safe_content_type, safe_header_value
from llmfabric.ingress.errors import Reply, error_reply


class Stop(Exception):
    """Internal: a limit was hit inside a parser callback; the error is already queued."""


class FrontRequest:
    """What the front keeps of a request while it is read (only what the core needs)."""

    __slots__ = ("auth", "auth_wait", "body", "close", "error", "expect", "fetch_site",
                 "hand_over", "head_done", "headers", "host", "keep_alive", "method",
                 "origin", "parts", "providers", "session_id", "size", "started",
                 "traceparent", "url", "version")

    def __init__(self, started: float = 0.0) -> None:
        self.url = b""
        self.method = b""
        self.auth = ""
        self.providers: str | None = None
        self.session_id: str | None = None  # X-Session-Id (validated by the core)
        self.traceparent: bytes | None = None  # W3C trace context, as received (tracing.py)
        self.host = b""  # Host, Origin and Sec-Fetch-Site: for HostGuard (host_check.py)
        self.origin: bytes | None = None
        self.fetch_site: bytes | None = None
        self.parts: list[bytes] = []
        self.body = b""
        self.size = 0
        self.keep_alive = True
        self.version = "1.1"
        self.error: Reply | None = None  # answer this instead, then close
        self.close = False
        self.expect = False  # Expect: 100-continue
        self.started = started  # monotonic time of the first byte (header timeout)
        self.head_done = False
        self.headers = 0  # header fields seen, and their bytes (in `size` until the body)
        self.auth_wait = False  # reading paused until the key is known valid
        self.hand_over = False  # not ours: the connection goes to the fallback server

    def keep_header(self, name: bytes, value: bytes, max_body: int) -> None:
        """Keep what the core needs of one header field (`name` lower-case). One dict
        lookup decides (most fields of a request are none of these)."""
        kind = _KEPT.get(name)
        if kind is None:
            return
        if kind == _AUTHORIZATION:
            self.auth = value.decode("latin-1")
        elif kind == _HOST:
            self.host = value
        elif kind == _API_KEY:
            if not self.auth:  # Anthropic clients' key header
                self.auth = "Bearer " + value.decode("latin-1")
        elif kind == _CONTENT_LENGTH:
            if value.strip().isdigit() and int(value) > max_body:  # (else llhttp rejects)
                self.body = b"!"  # a declared body over the limit: refused once the head is read
        elif kind == _PROVIDERS:
            self.providers = value.decode("latin-1")
        elif kind == _SESSION_ID:  # (validated by the core: routing/prefix.py)
            self.session_id = value.decode("latin-1")
        elif kind == _TRACEPARENT:
            self.traceparent = value
        elif kind == _EXPECT:
            self.expect = value.lower() == b"100-continue"
        elif kind == _ORIGIN:
            self.origin = value
        else:
            self.fetch_site = value


(_AUTHORIZATION, _HOST, _API_KEY, _CONTENT_LENGTH, _PROVIDERS, _SESSION_ID, _TRACEPARENT,
 _EXPECT, _ORIGIN, _FETCH_SITE) = range(10)
_KEPT = {b"authorization": _AUTHORIZATION, b"host": _HOST, b"x-api-key": _API_KEY,
         b"content-length": _CONTENT_LENGTH, b"x-fabric-providers": _PROVIDERS,
         b"x-session-id": _SESSION_ID, b"traceparent": _TRACEPARENT, b"expect": _EXPECT,
         b"origin": _ORIGIN, b"sec-fetch-site": _FETCH_SITE}


class FrontConnection(Protocol):
    """What a sink needs of the front's connection (fast_front._Connection)."""

    closed: bool
    transport: asyncio.Transport | None
    write_paused: bool
    answered: bool  # bytes of an answer to the current request were written

    async def wait_writable(self) -> None: ...

REASONS = {
    200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
    404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout",
    409: b"Conflict", 421: b"Misdirected Request", 413: b"Payload Too Large", 414: b"URI Too Long",
    422: b"Unprocessable Entity", 429: b"Too Many Requests",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
    501: b"Not Implemented", 502: b"Bad Gateway", 503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def _reason(status: int) -> bytes:
    """The reason phrase of a status not in REASONS (an engine's 418, say), never "OK"."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


def not_allowed(path: bytes, allow: str) -> Reply:
    return error_reply(405, f"{path.decode('latin-1')} accepts {allow} only",
                       "method_not_allowed", headers={"Allow": allow})


def response_head(status: int, content_type: str, node: str, extra: dict[str, str] | None,
                  close: bool, model: str = "") -> bytearray:
    reason = REASONS.get(status) or _reason(status)
    out = bytearray(b"HTTP/1.1 %d %s\r\nContent-Type: " % (status, reason))
    out += safe_content_type(content_type).encode()
    if node:
        out += b"\r\nX-Fabric-Node: " + safe_header_value(node).encode()
    if model:
        out += b"\r\nX-Fabric-Model: "
        out += safe_header_value(model).encode()
    if extra:
        for k, v in extra.items():
            out += (b"\r\n" + safe_header_value(k).encode() + b": "
                    + safe_header_value(v).encode())
    if close:
        out += b"\r\nConnection: close"
    return out


# Response heads up to "Content-Length: " by (status, content type, node, model, keep-alive).
HeadCache = dict[tuple[int, str, str, str, bool], bytes]


def reply_bytes(heads: HeadCache, reply: Reply, keep: bool, head_only: bool) -> bytes:
    """A complete response (`head_only`: without its body, for HEAD); heads without extra
    headers are cached in `heads`."""
    if reply.headers:
        head = bytes(response_head(reply.status, reply.content_type, reply.node,
                                   reply.headers, not keep, reply.model)
                     + b"\r\nContent-Length: ")
    else:
        key = (reply.status, reply.content_type, reply.node, reply.model, keep)
        cached = heads.get(key)
        if cached is None:
            if len(heads) > 1024:
                heads.clear()
            cached = heads[key] = bytes(
                response_head(reply.status, reply.content_type, reply.node, None, not keep,
                              reply.model) + b"\r\nContent-Length: ")
        head = cached
    return b"%b%d\r\n\r\n%b" % (head, len(reply.body), b"" if head_only else reply.body)


class ResponseSink:
    """StreamSink writing a chunked (HTTP/1.1) or close-delimited (HTTP/1.0) response.

    The response head waits for the first body bytes so that both leave in one write (one
    syscall and one segment fewer before the first token)."""

    __slots__ = ("chunked", "complete", "conn", "head", "headers")

    def __init__(self, conn: FrontConnection, chunked: bool) -> None:
        self.headers: dict[str, str] | None = None  # extra response headers (X-Fabric-Trace)
        self.conn = conn
        self.chunked = chunked
        self.complete = False
        self.head = b""

    def _transport(self) -> asyncio.Transport:
        c = self.conn
        if c.closed or c.transport is None:
            raise ConnectionResetError("the client closed the connection")
        return c.transport

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        self._transport()  # (response_head drops control characters from every value)
        out = response_head(200, content_type, node, self.headers, not self.chunked, model)
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
        self.conn.answered = True
        t.write(data)
        return not self.conn.write_paused

    async def wait_writable(self) -> None:
        await self.conn.wait_writable()

    def direct_writer(self) -> ResponseSink:
        return self

    async def end(self) -> None:
        t = self._transport()
        self.conn.answered = True
        if self.chunked:
            t.write(self.head + b"0\r\n\r\n")
        elif self.head:
            t.write(self.head)
        self.head = b""
        self.complete = True


def switch_protocol(t: asyncio.Transport, proto: asyncio.Protocol, data: list[bytes],
                    resume: bool) -> None:
    """Give transport `t` to `proto` (a fallback server's), with the bytes already read
    from it; `resume`: its reading was paused and is resumed."""
    t.set_protocol(proto)
    if resume:
        t.resume_reading()
    proto.connection_made(t)
    proto.data_received(b"".join(data))


def too_many_connections() -> bytes:
    """The whole 503 answer to a connection over a cap (the front then closes it unread)."""
    body = error_reply(503, "too many connections; retry later", "too_many_connections").body
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%b"
            % (len(body), body))
