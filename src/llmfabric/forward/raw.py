"""Direct forwarding over a lean HTTP/1.1 client: pooled keep-alive connections, TCP_NODELAY.

Each upstream connection is an `asyncio.Protocol` whose bytes go straight into httptools'
`HttpResponseParser` (llhttp): no StreamReader, no per-read coroutine. The request is written
as one buffer (prebuilt head + body); of the response head only the status, Content-Type and
keep-alive are kept; body bytes (de-chunked by llhttp) are queued as they arrive and handed
to the caller unchanged. A caller waits only when nothing is queued yet, with one timer
(`loop.call_at`) per wait for the phase limit (`Timeouts`: connect, first byte, idle between
chunks, and the whole attempt's total), so the ingress needs no `asyncio.timeout` around
calls into this forwarder (`enforces_timeouts = True`). Reading from the node pauses while
more than `_HIGH_WATER` bytes wait for a slow client. A connection goes back to the pool only
when its response was read to the end and nothing followed it. Every connection has TCP
keepalive and TCP_USER_TIMEOUT on (`Timeouts.keepalive`, net/tcp_keepalive.py): a node that
vanishes without closing fails its stream within seconds, whatever `idle` allows.

With an `ssl` context the connections are TLS; `open_to(..., pin=peer_id)` then accepts
only a server whose (self-signed node) certificate derives that peer id, checked once per
connection (pooled connections are keyed by address and pin).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl as ssl_module
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import cast

import httptools

from llmfabric.forward.dial_gate import DialGate
from llmfabric.identity.certs import cert_identity
from llmfabric.identity.errors import IdentityError
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamBusyError, UpstreamConnectError, UpstreamError
from llmfabric.ingress.paths import ENGINE_PATHS
from llmfabric.ingress.protocols import SocketRelay
from llmfabric.ingress.tracing import downstream_header
from llmfabric.net.tcp_keepalive import KeepAlive, set_keepalive
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NO_HOP, NodeHop, parse_node_time

_HIGH_WATER = 256 * 1024  # queued body bytes before reading from the node pauses
_LOW_WATER = 64 * 1024


class _Timeout(Exception):
    """Internal: a phase limit passed while waiting for the node."""


class _UpConn(asyncio.Protocol):
    """One keep-alive connection to a node; serves one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False  # the connection is gone (closed by either side)
        self.reusable = True  # False once anything unexpected happened
        self.reading_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self._reset()

    def _reset(self) -> None:
        self.active = False  # a request is in flight
        self.messages = 0  # responses begun since the request was sent
        self.status = 0
        self.content_type = "application/json"
        self.node_time = b""  # X-Fabric-Node-Time as received (telemetry/node_hop.py)
        self.head_done = False
        self.complete = False
        self.framed = False  # Content-Length or chunked: the end is known without EOF
        self.body: deque[bytes] = deque()
        self.queued = 0
        self.error: UpstreamError | None = None
        self.any_body = False
        # Relay mode (RawUpstream.relay): body bytes go to `push` inside on_body.
        self.push: Callable[[bytes], bool] | None = None
        self.push_error: BaseException | None = None
        self.blocked = False  # push said the client is full: reading paused, bytes queue
        self.idle = 0.0
        self.total_deadline = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.active or self.complete:
            self.reusable = False  # bytes nobody asked for: this connection is out of step
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.reusable = False
            self.error = UpstreamError(f"malformed response from the node: {e}")
            self.close()
        if self.push is None or self.blocked or self.complete or self.error is not None:
            self._wake()  # (in relay mode plain body bytes need no wake-up)
        elif self.push_error is not None:
            self._wake()
        if self.queued > _HIGH_WATER and not self.reading_paused and self.transport:
            self.reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.reusable = False
        if self.active and not self.complete and self.error is None:
            if self.head_done and not self.framed:
                self.complete = True  # a close-delimited body ends here
            elif isinstance(exc, TimeoutError):  # ETIMEDOUT: keepalive / user timeout
                self.error = UpstreamError("the node stopped answering mid-response (TCP "
                                           "keepalive: dead peer or partition)")
            elif self.head_done or self.messages:
                self.error = UpstreamError(
                    f"the node closed the connection mid-response ({exc!r})"
                    if exc else "the node closed the connection mid-response")
        self._wake()

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.messages += 1
        if self.messages > 1:
            self.reusable = False

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-type":
            self.content_type = value.strip().decode("latin-1")
        elif n == b"x-fabric-node-time":
            self.node_time = value
        elif n == b"content-length" or (n == b"transfer-encoding"
                                        and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        p = self.parser
        self.status = p.get_status_code()
        if not p.should_keep_alive():
            self.reusable = False
        if self.status in (204, 304):
            self.framed = True
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if self.messages != 1:
            return
        self.any_body = True
        push = self.push
        if push is not None and not self.blocked and self.push_error is None:
            self.deadline = min(self.loop.time() + self.idle, self.total_deadline)
            try:
                if push(body):
                    return
            except BaseException as e:  # the client is gone (or a bug): the relay raises it
                self.push_error = e
                return
            self.blocked = True  # the client's buffer is full: stop reading from the node
            if not self.reading_paused and self.transport is not None:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        self.body.append(body)
        self.queued += len(body)

    def on_message_complete(self) -> None:
        if self.messages == 1:
            self.complete = True

    # -- waiting -------------------------------------------------------------------------

    def _wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    async def wait(self, deadline: float) -> None:
        """Wait for the next event from the node (bytes, end, error) until `deadline`.

        One timer per connection, re-armed lazily: a wait only moves the deadline unless the
        armed timer would fire too late (no TimerHandle per chunk)."""
        fut = self.loop.create_future()
        self.waiter = fut
        self.deadline = deadline
        timer = self.timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(deadline, self._on_timer)
        await fut

    def _on_timer(self) -> None:
        self.timer = None
        w = self.waiter
        if w is None or w.done():
            return  # nobody waits: the next wait arms a new timer
        if self.loop.time() + 0.001 >= self.deadline:  # (timers may fire a tick early)
            self.waiter = None
            w.set_exception(_Timeout())
        else:
            self.timer = self.loop.call_at(self.deadline, self._on_timer)

    def resume(self) -> None:
        if self.reading_paused and self.queued <= _LOW_WATER and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def take(self) -> bytes:
        data = self.body.popleft()
        self.queued -= len(data)
        if self.reading_paused and self.queued <= _LOW_WATER and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()

    def usable(self) -> bool:
        return self.reusable and not self.lost


class RawUpstream:
    """One response from a node (see `Upstream`); `aclose()` must always be called."""

    __slots__ = ("_conn", "_deadline", "_first", "_forwarder", "_idle", "_key", "_node_time",
                 "_timeouts", "content_type", "status")

    def __init__(self, forwarder: RawHttpForwarder, key: str, conn: _UpConn,
                 timeouts: Timeouts, deadline: float, first: float) -> None:
        self._forwarder = forwarder
        self._key = key
        self._conn: _UpConn | None = conn
        self._timeouts = timeouts
        self._deadline = deadline  # the whole attempt's end (Timeouts.total)
        self._first = first  # the first body byte's deadline (Timeouts.first_byte)
        self._idle = timeouts.idle
        self.status = conn.status
        self.content_type = conn.content_type
        self._node_time = conn.node_time

    async def _next(self, conn: _UpConn) -> bytes | None:
        """The next queued body bytes, None at the end; raises UpstreamError."""
        while True:
            if conn.body:
                return conn.take()
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return None
            if conn.lost:
                raise UpstreamError("the node closed the connection mid-response")
            now = conn.loop.time()
            if conn.any_body:
                limit, what = now + self._idle, f"no data for {self._idle} s"
            else:
                limit, what = self._first, f"no byte within {self._timeouts.first_byte} s"
            if self._deadline < limit:
                limit, what = self._deadline, f"timed out after {self._timeouts.total} s"
            try:
                await conn.wait(limit)
            except _Timeout:
                conn.reusable = False
                conn.close()
                raise UpstreamError(f"the node sent {what}") from None

    async def read(self) -> bytes:
        return await self.read_capped(1 << 62)

    async def read_capped(self, limit: int) -> bytes:
        """The whole body; UpstreamError once it grows past `limit` bytes (an endless or
        huge body from a hostile node cannot exhaust the ingress's memory)."""
        conn = self._conn
        if conn is None:
            return b""
        if conn.complete and len(conn.body) == 1 and conn.queued <= limit:
            return conn.take()  # the whole response came at once
        parts: list[bytes] = []
        size = 0
        while (data := await self._next(conn)) is not None:
            size += len(data)
            if size > limit:
                conn.reusable = False
                conn.close()
                raise UpstreamError(f"the node's response is larger than {limit} bytes")
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> AsyncGenerator[bytes, None]:
        return self._iter()

    def socket_relay(self) -> SocketRelay:
        return self.relay

    @property
    def hop(self) -> NodeHop:
        return NodeHop(parse_node_time(self._node_time)) if self._node_time else NO_HOP

    async def relay(
        self, push: Callable[[bytes], bool], writable: Callable[[], Awaitable[None]]
    ) -> None:
        """Hand the rest of the body to `push` as it arrives, from the protocol callback
        itself (no task wake-up per chunk). `push` returns False when the client's buffer is
        full: reading from the node then pauses until `writable()` returns. Raises
        UpstreamError (node failure or timeout) or what `push`/`writable` raised."""
        conn = self._conn
        if conn is None:
            return
        conn.idle = self._idle
        conn.total_deadline = self._deadline
        conn.blocked = False
        while conn.body:  # what was already queued
            if not push(conn.take()):
                await writable()
        conn.deadline = min(conn.loop.time() + self._idle, self._deadline)
        conn.push = push
        try:
            while True:
                if conn.push_error is not None:
                    raise conn.push_error
                if conn.blocked:
                    await writable()
                    conn.blocked = False
                    while conn.body:  # bytes that arrived while the client was full
                        if not push(conn.take()):
                            conn.blocked = True
                            break
                    if not conn.blocked:
                        conn.deadline = min(conn.loop.time() + self._idle, self._deadline)
                        conn.resume()
                    continue
                if conn.error is not None:
                    raise conn.error
                if conn.complete:
                    return
                if conn.lost:
                    raise UpstreamError("the node closed the connection mid-response")
                try:
                    await conn.wait(conn.deadline)
                except _Timeout:
                    conn.reusable = False
                    conn.close()
                    what = (f"timed out after {self._timeouts.total} s"
                            if conn.loop.time() + 0.001 >= self._deadline
                            else f"no data for {self._idle} s")
                    raise UpstreamError(f"the node sent {what}") from None
        finally:
            conn.push = None

    async def _iter(self) -> AsyncGenerator[bytes, None]:
        conn = self._conn
        if conn is None:
            return
        while (data := await self._next(conn)) is not None:
            yield data

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and not conn.body and conn.usable():
            conn._reset()
            self._forwarder._release(self._key, conn)
        else:
            conn.reusable = False
            conn.close()


class RawHttpForwarder:
    """POSTs to `http://{candidate.http_addr}{path_prefix}{path}` (see HttpForwarder)."""

    enforces_timeouts = True  # every Timeouts phase is enforced here (see module doc)

    def __init__(
        self,
        path_prefix: str = "",
        *,
        max_idle_per_node: int = 256,
        max_dials_per_node: int = 32,
        extra_headers: dict[str, str] | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self._ssl = ssl
        self._dials = DialGate(max_dials_per_node)  # connection attempts in flight per node
        self._prefix = path_prefix.encode()
        self._max_idle = max_idle_per_node
        extra = "".join(f"{k}: {v}\r\n" for k, v in (extra_headers or {}).items())
        self._extra = extra.encode("latin-1")
        self._idle: dict[str, list[_UpConn]] = {}
        self._heads: dict[tuple[str, str], bytes] = {}
        self._closed = False

    def _head(self, addr: str, path: str) -> bytes:
        key = (addr, path)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) > 4096:
                self._heads.clear()
            head = (
                # (engines themselves, no prefix: their own path for e.g. /v1/tokenize)
                b"POST " + self._prefix
                + (path if self._prefix else ENGINE_PATHS.get(path, path)).encode()
                + b" HTTP/1.1\r\nHost: "
                + addr.encode() + b"\r\nContent-Type: application/json\r\n" + self._extra
            )
            self._heads[key] = head
        return head

    def _release(self, addr: str, conn: _UpConn) -> None:
        pool = self._idle.get(addr)
        if pool is None:
            pool = self._idle[addr] = []
        if self._closed or len(pool) >= self._max_idle:
            conn.close()
        else:
            pool.append(conn)

    async def _connect(self, addr: str, connect_s: float, pin: str,
                       keepalive: KeepAlive) -> _UpConn:
        host, _, port = addr.rpartition(":")
        loop = asyncio.get_running_loop()
        tls = self._ssl
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _UpConn(loop), host.strip("[]"), int(port), ssl=tls,
                    server_hostname="llmfabric" if tls is not None else None,
                )
        except (OSError, TimeoutError, ValueError) as e:
            raise UpstreamConnectError(f"cannot connect to {addr}: {e!r}") from e
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None:  # (a node that vanishes mid-stream: net/tcp_keepalive.py)
            try:
                set_keepalive(sock, keepalive)
            except OSError as e:
                conn.close()
                raise UpstreamConnectError(f"{addr}: cannot enable TCP keepalive: {e!r}") from e
        if pin:
            t = conn.transport
            obj = t.get_extra_info("ssl_object") if t is not None else None
            der = obj.getpeercert(binary_form=True) if obj is not None else None
            try:
                got = cert_identity(der)[0] if der else ""
            except IdentityError:
                got = ""
            if got != pin:
                conn.reusable = False
                conn.close()
                raise UpstreamConnectError(
                    f"{addr} is not node {pin[:16]}... (its certificate names "
                    f"{got[:16] or 'no node'}): refused")
        return conn

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> RawUpstream:
        addr = candidate.http_addr
        if not addr:
            raise UpstreamError(f"node {candidate.session_id} has no HTTP address")
        return await self.open_to(addr, path, body, timeouts)

    async def open_to(
        self, addr: str, path: str, body: bytes, timeouts: Timeouts, *, extra: bytes = b"",
        pin: str = "",
    ) -> RawUpstream:
        """POST to `addr`; `extra`: more header lines (each ending in CRLF); `pin`: the
        server's peer id (TLS only)."""
        request = (self._head(addr, path) + extra + downstream_header()
                   + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        key = f"{addr}#{pin}" if pin else addr
        pool = self._idle.get(key)
        loop = pool[-1].loop if pool else asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total
        while pool:  # (inline, not `_take_idle` + a turn: the hot path of a pooled request)
            conn = pool.pop()
            if not conn.usable():
                conn.close()
                continue
            up = await self._exchange(key, conn, request, timeouts, deadline, stale_ok=True)
            if up is not None:
                return up
            # the node closed this idle connection before answering: use another
        while True:
            conn, fresh = await self._turn(addr, key, pin, timeouts, deadline)
            up = await self._exchange(key, conn, request, timeouts, deadline,
                                      stale_ok=not fresh)
            if up is not None:
                return up
            if fresh:  # (stale_ok=False raises instead)
                raise UpstreamError(f"{addr} closed the connection without answering")
            # a pooled connection the node had closed: take another turn

    async def _turn(self, addr: str, key: str, pin: str, timeouts: Timeouts,
                    deadline: float) -> tuple[_UpConn, bool]:
        """(a connection to send on, whether it is new) under a dial turn (`DialGate`): an
        idle one that came back to the pool while this request waited its turn, else a new
        one. The turn covers taking or dialling only, never the exchange, so a request on a
        slow pooled connection holds no other request's dial back."""
        loop = asyncio.get_running_loop()
        connect_by = loop.time() + min(timeouts.connect, deadline - loop.time())
        try:
            async with asyncio.timeout_at(connect_by):
                await self._dials.acquire(key)
        except TimeoutError as e:
            raise UpstreamBusyError(
                f"cannot connect to {addr}: {self._dials.limit} connection attempts to it "
                "already in flight") from e
        try:
            conn = self._take_idle(key)
            if conn is not None:
                return conn, False
            return await self._connect(addr, connect_by - loop.time(), pin,
                                       timeouts.keepalive), True
        finally:
            self._dials.release(key)

    def _take_idle(self, key: str) -> _UpConn | None:
        """A usable idle pooled connection of `key` (closing the unusable ones), or None."""
        pool = self._idle.get(key)
        while pool:
            conn = pool.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _exchange(
        self, addr: str, conn: _UpConn, request: bytes, timeouts: Timeouts, deadline: float,
        stale_ok: bool,
    ) -> RawUpstream | None:
        """Send the request and wait for the response head; None when a pooled connection
        turned out closed before any response byte (safe to resend elsewhere)."""
        t = conn.transport
        if t is None or t.is_closing():
            conn.close()
            if stale_ok:
                return None
            raise UpstreamError(f"{addr} closed the connection without answering")
        conn.active = True
        t.write(request)
        loop = conn.loop
        first = min(loop.time() + timeouts.first_byte, deadline)
        while not conn.head_done:
            if conn.error is not None:
                conn.close()
                raise UpstreamError(f"{addr}: {conn.error}")
            if conn.lost:
                if conn.messages == 0:
                    if stale_ok:
                        return None
                    raise UpstreamError(f"{addr} closed the connection without answering")
                raise UpstreamError(f"{addr} sent a truncated response head")
            try:
                await conn.wait(first)
            except _Timeout:
                conn.reusable = False
                conn.close()
                raise UpstreamError(
                    f"{addr} sent no response within {timeouts.first_byte} s") from None
            except BaseException:
                conn.reusable = False
                conn.close()
                raise
        return RawUpstream(self, addr, conn, timeouts, deadline, first)

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._idle.values():
            for conn in pool:
                conn.close()
        self._idle.clear()
