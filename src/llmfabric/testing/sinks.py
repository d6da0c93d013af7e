"""In-memory `StreamSink`s (ingress/protocols.py) for calling `Ingress.serve` without an HTTP
server: `MemorySink` keeps what a streamed response started with and its bytes; `NoSink`
is for requests that must not stream (any write fails the test)."""

from __future__ import annotations

import asyncio


class MemorySink:
    """A stream's head (`started`: content type, node, model), bytes and end, in memory;
    `wrote` is set by the first write."""

    headers: dict[str, str] | None = None  # (where `traced` puts X-Fabric-Trace)

    def __init__(self) -> None:
        self.data = b""
        self.started: tuple[str, str, str] | None = None
        self.ended = False
        self.wrote = asyncio.Event()

    @property
    def node(self) -> str:
        """The node the stream started from ("" before it started)."""
        return self.started[1] if self.started is not None else ""

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        self.started = (content_type, node, model)

    async def write(self, data: bytes) -> None:
        self.data += data
        self.wrote.set()

    async def end(self) -> None:
        self.ended = True

    def direct_writer(self) -> None:
        return None


class NoSink:
    """The sink of a request that must be answered whole: streaming into it fails."""

    headers: dict[str, str] | None = None

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        raise AssertionError("not a stream")

    async def write(self, data: bytes) -> None:
        raise AssertionError("not a stream")

    async def end(self) -> None:
        raise AssertionError("not a stream")

    def direct_writer(self) -> None:
        return None
