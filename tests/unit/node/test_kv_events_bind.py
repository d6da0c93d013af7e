"""The node's KV-cache event subscriber never listens beyond loopback (node/engine/
kv_events_link.py): an engine that connects to a non-loopback address would make the node
bind there, where anyone could publish forged events."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.agent.kv_events_config import KvEventsConfigError, KvEventsEndpoint
from llmfabric.node.engine.kv_events_link import KvEventsLink
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
