"""A data-plane session exchange is shared by every request waiting for that peer; when the
request that opened it is cancelled (its client left, or the ingress dropped its attempt on a
node suspected meanwhile), the others get an UpstreamError to retry on, never a cancellation
that is not theirs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llmfabric.forward.secure import DataPlaneSessions
from llmfabric.identity import NodeKey
from llmfabric.ingress.errors import UpstreamError


class _Silent:
    """A peer transport whose session request never gets an answer."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def request(
        self,
        peer_id: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        timeout: float = 0.0,  # noqa: ASYNC109 (the transport's signature)
    ) -> object:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_waiters_of_a_cancelled_session_exchange_get_an_upstream_error() -> None:
    transport = _Silent()
    sessions = DataPlaneSessions(NodeKey.generate(), transport)  # type: ignore[arg-type]
    leader = asyncio.ensure_future(sessions.get("peer", 3600))
    await transport.asked.wait()
    waiter = asyncio.ensure_future(sessions.get("peer", 3600))
    await asyncio.sleep(0)  # (the waiter now awaits the shared exchange)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    with pytest.raises(UpstreamError, match="ended before"):
        await waiter
    assert not waiter.cancelled()
