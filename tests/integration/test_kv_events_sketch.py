"""The node's prefix sketch from its engine's KV-cache events, over real ZMQ sockets.

The simulated engine (a subprocess started by the node's EngineLink, as a node starts it)
publishes its prefix cache's stores and evictions in vLLM's format; the node reads the flag
from the engine command, subscribes, and its published sketch holds a prompt while the
engine does and drops it once the engine evicted it. Hostile messages on the same socket
are counted and dropped.
"""

from __future__ import annotations

import json
import pathlib

import orjson
import pytest

from llmfabric.agent import InflightTracker
from llmfabric.agent.kv_events_config import KvEventsEndpoint
from llmfabric.clock import SystemClock
from llmfabric.engines.kv_publisher import KvEventPublisher, cache_events
from llmfabric.engines.text import block_ids
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.net.ports import free_port
from llmfabric.node.config import NodeConfig
from llmfabric.node.engine_link import EngineLink, KvEventsLink
from llmfabric.registry.cache_sketch import matched_blocks
from llmfabric.routing.cache_summary import ServedPrefixes
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.routing.prefix import block_keys
from llmfabric.testing.poll import wait_until

from ._sim_engine_proc import sim_command

pytestmark = pytest.mark.timeout(60)


def _prompt(tag: str) -> str:
    return (f"{tag} " * 600)[:1024]  # 4 routing keys; 16 of the engine's 64-character blocks


async def _forward(engine: EngineLink, prompt: str) -> None:
    body = orjson.dumps({"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 2})
    resp = await engine.serve_body(FORWARD_PREFIX + "/v1/completions", body)
    assert resp.status == 200
    assert not isinstance(resp.body, bytes)
    async for _ in resp.body:
        pass


async def test_published_sketch_follows_the_engines_evictions(tmp_path: pathlib.Path) -> None:
    port = free_port()
    flag = json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{port}",
            "topic": "kv",
        }
    )
    # 40 blocks: two 16-block prompts fit, a third evicts the first.
    argv = sim_command(free_port(), "--kv-blocks", "40", "--kv-events-config", flag)
    config = NodeConfig(home=tmp_path, process=tuple(argv), ready_timeout_s=30)
    clock = SystemClock()
    engine = EngineLink(config, clock, InflightTracker())
    assert engine.kv_events is not None  # (read from the engine command)
    held = engine.served_prefixes
    assert isinstance(held, HeldPrefixes)
    try:
        await engine.start()
        a, b, c = _prompt("alpha"), _prompt("bravo"), _prompt("charlie")
        ka, kb, kc = block_keys(a), block_keys(b), block_keys(c)
        await _forward(engine, a)
        await wait_until(lambda: matched_blocks(held.sketch(), ka) == 4, 10, "a held")
        assert held.due(clock.now())
        published = held.published(clock.now())
        assert matched_blocks(published, ka) == 4 and matched_blocks(published, kb) == 0
        await _forward(engine, b)
        await wait_until(lambda: matched_blocks(held.sketch(), kb) == 4, 10, "b held")
        assert matched_blocks(held.sketch(), ka) == 4  # both fit in the engine's 40 blocks
        await _forward(engine, c)  # the engine evicts a's blocks
        await wait_until(lambda: matched_blocks(held.sketch(), kc) == 4, 10, "c held")
        await wait_until(lambda: ka[0] not in held, 10, "a dropped")
        published = held.published(clock.now() + 60)
        assert matched_blocks(published, ka) == 0
        assert matched_blocks(published, kb) >= 1 and matched_blocks(published, kc) == 4
        view = engine.local_view()["kv_events"]
        assert isinstance(view, dict)
        assert view["dropped"] == {} and view["blocks_removed"] == 8 and view["gaps"] == 0
    finally:
        await engine.aclose(5.0)


async def test_hostile_messages_are_counted_and_dropped(tmp_path: pathlib.Path) -> None:
    """A publisher sending garbage on the subscribed topic: counted, the loop goes on and a
    good message after it is applied."""
    import zmq

    port = free_port()
    link = KvEventsLink(
        KvEventsEndpoint(f"tcp://127.0.0.1:{port}", "kv"), HeldPrefixes(SystemClock().now)
    )
    link.open()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{port}")
    good = KvEventPublisher(f"tcp://127.0.0.1:{port}", "kv")
    try:
        prompt = _prompt("delta")
        keys = block_keys(prompt)
        link.held.observe(keys, len(prompt))

        def send_all() -> bool:
            pub.send_multipart([b"kv", b"\0" * 8, b"\xc1garbage"])
            pub.send_multipart([b"kv", b"short", b""])
            pub.send_multipart([b"kv", b"\0" * 8, orjson.dumps({"not": "msgpack"})])
            return link.dropped["malformed"] >= 3

        await wait_until(send_all, 10, "hostile messages received")  # (slow joiner)
        ids = block_ids(prompt)
        good.publish(cache_events(prompt, ids, [False] * len(ids), []))
        await wait_until(lambda: matched_blocks(link.held.sketch(), keys) == 4, 10, "applied")
        assert link.applied >= 1
    finally:
        good.close()
        pub.close(linger=0)
        ctx.term()
        await link.aclose()


def test_without_events_the_sketch_is_what_the_node_served(tmp_path: pathlib.Path) -> None:
    argv = sim_command(free_port())
    engine = EngineLink(
        NodeConfig(home=tmp_path, process=tuple(argv)), SystemClock(), InflightTracker()
    )
    assert engine.kv_events is None and isinstance(engine.served_prefixes, ServedPrefixes)
    flag = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5999"}'
    # (an engine whose command does not show the flag: a wrapper script, a config file)
    external = NodeConfig(home=tmp_path, process=tuple(argv), kv_events_config=flag)
    engine = EngineLink(external, SystemClock(), InflightTracker())
    assert engine.kv_events is not None and isinstance(engine.served_prefixes, HeldPrefixes)
    with pytest.raises(ValueError, match="kv-events-config"):
        NodeConfig(home=tmp_path, kv_events_config='{"enable_kv_cache_events": 1}')
