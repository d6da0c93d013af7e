"""Fixtures: clusters of GossipAgents on one FakeClock over an in-memory network."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS, GossipConfig
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


@dataclass
class Cluster:
    clock: FakeClock
    net: MemNet
    config: GossipConfig
    agents: list[GossipAgent] = field(default_factory=list)
    seed: int = 0

    async def add(self, *, seeds: list[str] | None = None, serve: bool = True) -> GossipAgent:
        key = NodeKey.generate()
        meta = NodeMeta(provider_id=f"p{len(self.agents)}",
                        models=(ServedModel("m", aliases=("alias",)),))
        if seeds is None:
            seeds = [self.agents[0].peer_id] if self.agents else []
        agent = GossipAgent(self.net.transport(key.peer_id), self.clock, key, meta,
                            config=self.config, seeds=seeds,
                            rng=random.Random(self.seed * 1000 + len(self.agents)))
        await agent.start()
        if serve:
            agent.set_state(Lifecycle.SERVING)
        self.agents.append(agent)
        return agent

    def live(self) -> list[GossipAgent]:
        return [a for a in self.agents if a._running]

    def converged(self, agents: list[GossipAgent] | None = None) -> bool:
        agents = agents if agents is not None else self.live()
        roots = {a.replica.root() for a in agents}
        return len(roots) == 1

    async def kill(self, agent: GossipAgent) -> None:
        self.net.kill(agent.peer_id)
        await agent.aclose()

    async def aclose(self) -> None:
        for a in self.agents:
            await a.aclose()
        await self.net.aclose()


MakeCluster = Callable[..., "Cluster"]


@pytest.fixture
async def make_cluster() -> AsyncIterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def _make(preset: str = "local", *, seed: int = 0, **net_opts: object) -> Cluster:
        clock = FakeClock()
        net = MemNet(clock, seed=seed, **net_opts)  # type: ignore[arg-type]
        c = Cluster(clock, net, PRESETS[preset], seed=seed)
        made.append(c)
        return c

    yield _make
    for c in made:
        await c.aclose()
