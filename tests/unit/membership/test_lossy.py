"""SWIM under packet loss: no false eviction; real failures are still detected."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.records import Lifecycle
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


async def _cluster(n: int, net: MemNet, clock: FakeClock, preset: str) -> list[GossipAgent]:
    agents: list[GossipAgent] = []
    for i in range(n):
        key = NodeKey.generate()
        a = GossipAgent(net.transport(key.peer_id), clock, key, config=PRESETS[preset],
                        seeds=[agents[0].peer_id] if agents else [], rng=random.Random(i))
        await a.start()
        a.set_state(Lifecycle.SERVING)
        agents.append(a)
    return agents


@pytest.fixture
async def closer() -> AsyncIterator[list[object]]:
    things: list[object] = []
    yield things
    for t in things:
        await t.aclose()  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_no_false_eviction_at_10_percent_loss(closer: list[object]) -> None:
    clock = FakeClock()
    net = MemNet(clock, seed=7, loss=0.10, delay=(0.001, 0.010), duplicate=0.01, reorder=0.05)
    closer.append(net)
    agents = await _cluster(10, net, clock, "local")
    closer[:0] = agents
    assert await clock.run_until(lambda: all(len(a.nodes.routable()) == 10 for a in agents),
                                 within=20)
    for _ in range(60):  # 10 virtual minutes
        await clock.advance(10.0)
        for a in agents:
            assert all(v.state is Lifecycle.SERVING for v in a.nodes.all()), "false eviction"
    raised = sum(a.stats.suspicions_raised for a in agents)
    refuted = sum(a.stats.refutations for a in agents)
    # the loss is real: probes failed and suspicions were raised, and all were refuted
    assert raised > 0 and refuted > 0
    assert not any(a.evicted for a in agents)
    assert net.dropped["loss"] > 0
    # a real failure under the same loss is still detected and evicted
    victim = agents[5]
    net.kill(victim.peer_id)
    others = [a for a in agents if a is not victim]
    hi = PRESETS["local"].suspicion_bounds(10)[1]
    assert await clock.run_until(lambda: all(
        a.nodes.get(victim.session_id).state is Lifecycle.LEFT  # type: ignore[union-attr]
        for a in others), within=hi + 10)
    await asyncio.sleep(0)
