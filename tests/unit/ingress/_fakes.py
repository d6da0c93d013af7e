"""Test doubles shared by the ingress unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator


class OkUpstream:
    """An upstream response that answers 200 with an empty JSON object."""

    status = 200
    content_type = "application/json"

    async def read(self) -> bytes:
        return b"{}"

    async def chunks(self) -> AsyncIterator[bytes]:
        yield b"{}"

    async def aclose(self) -> None:
        return None
