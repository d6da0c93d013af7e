"""The local engine's response to a node's proxied request: `HttpUpstream`, an `Upstream`
over aiohttp's client (the node's only client to its own engine; engine_proxy.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import aiohttp

from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.protocols import read_chunks_capped
from llmfabric.telemetry.node_hop import NO_HOP, NodeHop


class HttpUpstream:
    """The local engine's response (an `Upstream` over aiohttp's client)."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        return self._resp.headers.get("Content-Type", "application/json")

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"reading the response failed: {e!r}") from e

    async def read_capped(self, limit: int) -> bytes:
        try:
            return await read_chunks_capped(self.chunks(), limit)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"reading the response failed: {e!r}") from e

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        # Raises aiohttp.ClientError / TimeoutError mid-stream; callers handle both.
        async for data in self._resp.content.iter_any():
            yield data

    def socket_relay(self) -> None:
        return None

    @property
    def hop(self) -> NodeHop:
        return NO_HOP  # (the engine itself: no hop past it)

    async def aclose(self) -> None:
        self._resp.release()
