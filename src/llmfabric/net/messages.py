"""Peer request API types: `PeerRequest` (what a handler gets), `PeerResponse` (what a caller
gets, streamed) and `HandlerResponse` (what a handler returns).

Bodies stream chunk by chunk with HTTP/2 flow control underneath: a reader that stops reading
stops the sender once the window (1 MiB per stream) is full; nothing is buffered beyond that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from llmfabric.net.errors import BodyTooLarge, RequestFailed

Headers = tuple[tuple[str, str], ...]
Body = bytes | AsyncIterable[bytes]

# Queue items: (data, flow-controlled length) chunks, None at end, or an exception.
ChunkItem = tuple[bytes, int] | None | BaseException


class BodyStream:
    """Receiving side of one h2 stream body. `ack(n)` returns flow-control credit."""

    def __init__(self, ack: Callable[[int], None], on_abort: Callable[[], None]) -> None:
        self._queue: asyncio.Queue[ChunkItem] = asyncio.Queue()
        self._ack = ack
        self._on_abort = on_abort
        self._done = False

    def push(self, item: ChunkItem) -> None:
        self._queue.put_nowait(item)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        while not self._done:
            item = await self._queue.get()
            if item is None:
                self._done = True
                return
            if isinstance(item, BaseException):
                self._done = True
                raise RequestFailed(str(item)) from item
            data, flow_len = item
            self._ack(flow_len)
            if data:
                yield data

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; past `limit` bytes the stream is reset (the sender stops, since
        each chunk read returns flow-control credit) and BodyTooLarge is raised."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in self.iter_chunks():
            size += len(chunk)
            if limit is not None and size > limit:
                self.abort()
                raise BodyTooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._on_abort()

    @property
    def done(self) -> bool:
        return self._done


def find_header(headers: Headers, name: str, default: str | None = None) -> str | None:
    """The first value of header `name` (h2 header names arrive lower-cased)."""
    name = name.lower()
    for k, v in headers:
        if k == name:
            return v
    return default


@dataclass(slots=True)
class PeerRequest:
    """An incoming request. `peer_id` is the authenticated origin (through a relay: the relay
    vouches for it; the relay itself is in `via`)."""

    peer_id: str
    method: str
    path: str
    headers: Headers
    body: BodyStream
    via: str | None = None

    def header(self, name: str, default: str | None = None) -> str | None:
        return find_header(self.headers, name, default)

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self.body.iter_chunks()

    async def read(self, limit: int | None = None) -> bytes:
        return await self.body.read(limit)


@dataclass(slots=True)
class HandlerResponse:
    """What a request handler returns; `body` may be bytes or an async iterator of bytes."""

    status: int = 200
    headers: Headers = ()
    body: Body = b""


RequestHandler = Callable[[PeerRequest], Awaitable[HandlerResponse]]


@dataclass(slots=True)
class PeerResponse:
    """A response from a peer. Read with `async for c in resp.iter_chunks()` or `read()`;
    always `await resp.aclose()` (or use `async with`) to release the stream."""

    status: int
    headers: Headers
    _body: BodyStream
    peer_id: str = ""
    via: str | None = None
    _closed: bool = field(default=False)

    def header(self, name: str, default: str | None = None) -> str | None:
        return find_header(self.headers, name, default)

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self._body.iter_chunks()

    async def read(self, limit: int | None = None) -> bytes:
        return await self._body.read(limit)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._body.abort()

    async def __aenter__(self) -> PeerResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
