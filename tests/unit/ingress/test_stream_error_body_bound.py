"""A streamed request's client error from the node (a 4xx passed through to the client) is
read up to the ingress's `max_response_bytes`, as a non-streamed answer is: a hostile
provider's 400 whose body never ends no longer grows the ingress's memory for good."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from llmfabric.ingress.attempt import _open_stream
from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.protocols import read_chunks_capped

pytestmark = pytest.mark.hostile


class EndlessError:
    """A node's 400 with a body that never ends."""

    status = 400
    content_type = "application/json"
    hop = None
    sent = 0

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        while True:
            self.sent += 65536
            yield b"E" * 65536
            await asyncio.sleep(0)

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    async def aclose(self) -> None:
        pass


async def test_a_client_error_without_end_is_read_up_to_the_cap() -> None:
    up = EndlessError()

    async def open_(*_a: Any) -> EndlessError:
        return up

    ing = SimpleNamespace(forwarder=SimpleNamespace(open=open_),
                          config=SimpleNamespace(timeouts=None, max_response_bytes=1 << 20))
    with pytest.raises(UpstreamError, match="larger than"):
        await asyncio.wait_for(_open_stream(ing, None, "/v1/chat/completions",  # type: ignore[arg-type]
                                            b"{}", [], "m"), 10)
    assert up.sent <= (1 << 20) + 65536
