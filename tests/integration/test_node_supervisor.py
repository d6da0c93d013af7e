"""A real node (TLS transport, gossip, HTTP API on loopback) under its supervisor:

- a background task that keeps failing is restarted, then takes the node down visibly:
  status 6, LEFT announced, the failures in /metrics;
- stop() racing session changes (rejoins) closes every GossipAgent the node ever made.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from prometheus_client import generate_latest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.node.config import build_config
from llmfabric.node.daemon import EXIT_TASK_FAILED, Node
from llmfabric.node.supervisor import RestartPolicy
from llmfabric.registry.records import Lifecycle, NodeMeta

pytestmark = pytest.mark.slow


def _node(home: pathlib.Path) -> Node:
    return Node(build_config({}, {
        "home": home, "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
        "preset": "local", "network_secret": "supervisor-test-secret-0123456789", "gpu": "cpu",
    }))


def _agents(node: Node) -> list[GossipAgent]:
    """Record every session the node makes from now on."""
    made: list[GossipAgent] = []
    make = node._new_agent

    def recording(meta: NodeMeta | None = None, *, serving: bool = False) -> GossipAgent:
        made.append(make(meta, serving=serving))
        return made[-1]

    node._new_agent = recording  # type: ignore[method-assign]
    return made


async def test_a_task_failing_beyond_its_policy_takes_the_node_down(
        tmp_path: pathlib.Path) -> None:
    node = _node(tmp_path / "n")
    await node.start()
    agent = node.session
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug in a publisher")

    node.supervisor.loop("publisher", broken, RestartPolicy(max_restarts=2, backoff_s=0.01))
    code = await asyncio.wait_for(node.wait_stopped(), 20)
    assert code == EXIT_TASK_FAILED and calls == 3
    assert agent.record.state is Lifecycle.LEFT  # announced, not just vanished
    assert node.transport._closing and node.supervisor.running() == []
    text = generate_latest(node.metrics.registry).decode()
    assert 'llmfabric_node_task_failures_total{task="publisher"} 3.0' in text


async def test_stop_racing_session_changes_leaves_no_agent_running(
        tmp_path: pathlib.Path) -> None:
    node = _node(tmp_path / "n")
    await node.start()
    made = _agents(node)
    first = node.session
    changes = [asyncio.ensure_future(node.change_session(node.meta())) for _ in range(3)]
    await asyncio.sleep(0)  # the first change is under way
    await asyncio.gather(node.stop(), node.stop(), *changes, return_exceptions=True)
    await node.stop()  # idempotent
    assert made, "no session change started before the stop"
    for agent in (first, *made):
        assert not agent._running and not agent._tasks, agent.session_id
    assert node.agent is not None and node.agent.record.state is Lifecycle.LEFT


async def test_an_evicted_session_rejoins_as_one_change(tmp_path: pathlib.Path) -> None:
    """The gossip agent reports an eviction (its callbacks, as SWIM would call them): the
    node continues under a new session with the same metadata, the old agent closed."""
    node = _node(tmp_path / "n")
    await node.start()
    try:
        evicted = node.session
        for callback in evicted._evicted_cbs:
            callback()
            callback()  # reported twice: one rejoin
        for _ in range(200):
            if node.session is not evicted:
                break
            await asyncio.sleep(0.01)
        fresh = node.session
        assert fresh is not evicted and fresh.session_id != evicted.session_id
        assert fresh._running and not evicted._running
        assert fresh.record.meta.http_addr == evicted.record.meta.http_addr != ""
        assert not node.supervisor.failures and not node.stopping
    finally:
        await node.stop(drain=False)
