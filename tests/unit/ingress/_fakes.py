"""Test doubles shared by the ingress unit tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from llmfabric.telemetry.node_hop import NO_HOP


class OkUpstream:
    """An upstream response that answers 200 with an empty JSON object."""

    status = 200
    content_type = "application/json"
    hop = NO_HOP

    async def read(self) -> bytes:
        return b"{}"

    async def read_capped(self, limit: int) -> bytes:
        return b"{}"

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        yield b"{}"

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
