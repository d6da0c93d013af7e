"""The node's KV-cache event subscriber never listens beyond loopback (KvEventsLink in
node/engine_link.py): an engine that connects to a non-loopback address would make the node
bind there, where anyone could publish forged events."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.agent.kv_events_config import KvEventsConfigError, KvEventsEndpoint
from llmfabric.node.engine_link import KvEventsLink
from llmfabric.routing.held_prefixes import HeldPrefixes

pytestmark = pytest.mark.hostile


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5599", "tcp://10.1.2.3:5599",
                                      "tcp://example.org:5599"])
async def test_a_bind_beyond_loopback_is_refused(endpoint: str) -> None:
    link = KvEventsLink(KvEventsEndpoint(endpoint), HeldPrefixes(lambda: 0.0))
    with pytest.raises(KvEventsConfigError, match="not a loopback address"):
        link.open()


async def test_loopback_binds_and_wildcard_connects_are_used() -> None:
    for endpoint in ("tcp://127.0.0.1:0", "tcp://*:5598"):  # bind here / connect to 127.0.0.1
        link = KvEventsLink(KvEventsEndpoint(endpoint), HeldPrefixes(lambda: 0.0))
        link.open()
        await asyncio.sleep(0)
        await link.aclose()


async def test_a_flood_of_events_does_not_starve_the_event_loop() -> None:
    """A socket read returns at once while messages are queued, so the receive loop never
    gave way: a publisher flooding small valid messages stalled everything else on the node
    (a 10 ms ticker ran 136 times in 8 s, with a 6.6 s gap)."""
    import asyncio

    import msgpack

    payload = msgpack.packb([1.0, [{"type": "AllBlocksCleared"}]])

    class Flood:  # a socket with messages always queued
        seq = 0

        async def recv_multipart(self, copy: bool = True) -> list[bytes]:
            self.seq += 1
            return [b"kv", self.seq.to_bytes(8, "big"), payload]

    link = KvEventsLink(KvEventsEndpoint("tcp://127.0.0.1:5557", topic="kv"),
                        HeldPrefixes(lambda: 0.0))
    link._sock = Flood()
    receiver = asyncio.create_task(link._receive())
    ticks = 0
    for _ in range(50):
        await asyncio.sleep(0)
        ticks += 1
    receiver.cancel()
    assert ticks == 50 and link.received >= 50 and link.dropped == {}
