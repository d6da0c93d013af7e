"""Direct forwarding over a lean HTTP/1.1 client: pooled keep-alive connections, TCP_NODELAY.

The request is written as one buffer (prebuilt head + body); the response head is parsed for
status, Content-Type, Content-Length / chunked and Connection only; the body is relayed as
bytes. aiohttp's client does much more per request (headers objects, cookie jar, tracing,
redirect handling), which was half of the ingress's CPU per request in profiles; this keeps the
hot path short. A connection goes back to the pool only when its response was read to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError
from llmfabric.routing.candidates import Candidate

_MAX_HEAD = 64 * 1024
_READ_SIZE = 64 * 1024


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class RawUpstream:
    __slots__ = (
        "_chunked",
        "_conn",
        "_done",
        "_forwarder",
        "_idle",
        "_keep",
        "_key",
        "_length",
        "content_type",
        "status",
    )

    def __init__(
        self, forwarder: RawHttpForwarder, key: str, conn: _Conn, status: int,
        content_type: str, length: int | None, chunked: bool, keep: bool, idle: float,
    ) -> None:
        self._forwarder = forwarder
        self._key = key
        self._conn: _Conn | None = conn
        self.status = status
        self.content_type = content_type
        self._length = length
        self._chunked = chunked
        self._keep = keep
        self._idle = idle
        self._done = length == 0

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self._iter()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._done:
            return
        r = conn.reader
        idle = self._idle
        try:
            if self._length is not None:
                left = self._length
                while left > 0:
                    async with asyncio.timeout(idle):
                        data = await r.read(min(left, _READ_SIZE))
                    if not data:
                        raise UpstreamError("the node closed the connection mid-response")
                    left -= len(data)
                    yield data
            elif self._chunked:
                while True:
                    async with asyncio.timeout(idle):
                        line = await r.readuntil(b"\r\n")
                        size = int(line.split(b";", 1)[0], 16)
                        if size == 0:
                            await r.readuntil(b"\r\n")  # (no trailers from engines)
                            break
                        data = await r.readexactly(size + 2)
                    yield data[:-2]
            else:  # delimited by the end of the connection
                self._keep = False
                while True:
                    async with asyncio.timeout(idle):
                        data = await r.read(_READ_SIZE)
                    if not data:
                        break
                    yield data
            self._done = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self._keep = False
            raise UpstreamError(f"malformed or truncated response from the node: {e!r}") from e
        except OSError as e:
            self._keep = False
            raise UpstreamError(f"connection to the node failed mid-response: {e!r}") from e

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep and conn.usable():
            self._forwarder._release(self._key, conn)
        else:
            conn.close()


class RawHttpForwarder:
    """POSTs to `http://{candidate.http_addr}{path_prefix}{path}` (see HttpForwarder)."""

    def __init__(
        self,
        path_prefix: str = "",
        *,
        max_idle_per_node: int = 256,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self._prefix = path_prefix.encode()
        self._max_idle = max_idle_per_node
        extra = "".join(f"{k}: {v}\r\n" for k, v in (extra_headers or {}).items())
        self._extra = extra.encode("latin-1")
        self._idle: dict[str, list[_Conn]] = {}
        self._heads: dict[tuple[str, str], bytes] = {}
        self._closed = False

    def _head(self, addr: str, path: str) -> bytes:
        key = (addr, path)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) > 4096:
                self._heads.clear()
            head = (
                b"POST " + self._prefix + path.encode() + b" HTTP/1.1\r\nHost: "
                + addr.encode() + b"\r\nContent-Type: application/json\r\n" + self._extra
                + b"Content-Length: "
            )
            self._heads[key] = head
        return head

    def _release(self, addr: str, conn: _Conn) -> None:
        pool = self._idle.setdefault(addr, [])
        if self._closed or len(pool) >= self._max_idle:
            conn.close()
        else:
            pool.append(conn)

    async def _connect(self, addr: str, connect_s: float) -> _Conn:
        host, _, port = addr.rpartition(":")
        try:
            async with asyncio.timeout(connect_s):
                reader, writer = await asyncio.open_connection(
                    host.strip("[]"), int(port), limit=_MAX_HEAD
                )
        except (OSError, TimeoutError, ValueError) as e:
            raise UpstreamError(f"cannot connect to {addr}: {e!r}") from e
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(reader, writer)

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> RawUpstream:
        addr = candidate.http_addr
        if not addr:
            raise UpstreamError(f"node {candidate.session_id} has no HTTP address")
        request = self._head(addr, path) + str(len(body)).encode() + b"\r\n\r\n" + body
        pool = self._idle.get(addr)
        while pool:
            conn = pool.pop()
            if not conn.usable():
                conn.close()
                continue
            try:
                return await self._exchange(addr, conn, request, timeouts)
            except _StaleConnection:
                continue  # the node closed this idle connection before reading: use another
        conn = await self._connect(addr, timeouts.connect)
        try:
            return await self._exchange(addr, conn, request, timeouts)
        except _StaleConnection as e:
            raise UpstreamError(f"{addr} closed the connection without answering") from e

    async def _exchange(
        self, addr: str, conn: _Conn, request: bytes, timeouts: Timeouts
    ) -> RawUpstream:
        try:
            conn.writer.write(request)
            async with asyncio.timeout(timeouts.first_byte):
                head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            conn.close()
            if not e.partial:
                raise _StaleConnection() from e
            raise UpstreamError(f"{addr} sent a truncated response head") from e
        except (ConnectionResetError, BrokenPipeError) as e:
            conn.close()
            raise _StaleConnection() from e
        except TimeoutError as e:
            conn.close()
            raise UpstreamError(
                f"{addr} sent no response within {timeouts.first_byte} s"
            ) from e
        except (OSError, asyncio.LimitOverrunError) as e:
            conn.close()
            raise UpstreamError(f"{addr}: {e!r}") from e
        try:
            return self._parse(addr, conn, head, timeouts.idle)
        except (ValueError, IndexError) as e:
            conn.close()
            raise UpstreamError(f"{addr} sent a malformed response head") from e

    def _parse(self, addr: str, conn: _Conn, head: bytes, idle: float) -> RawUpstream:
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        content_type = "application/json"
        length: int | None = None
        chunked = False
        keep = lines[0].startswith(b"HTTP/1.1")
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-type":
                content_type = value.strip().decode("latin-1")
            elif name == b"connection":
                v = value.strip().lower()
                keep = v != b"close" and (keep or v == b"keep-alive")
        if chunked:
            length = None
        elif length is None and status in (204, 304):
            length = 0
        return RawUpstream(self, addr, conn, status, content_type, length, chunked, keep, idle)

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._idle.values():
            for conn in pool:
                conn.close()
        self._idle.clear()


class _StaleConnection(Exception):
    pass
