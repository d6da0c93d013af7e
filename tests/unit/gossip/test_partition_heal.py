"""A partition longer than the suspicion timeouts, on a lossy network (loss, duplication,
reordering): each side evicts the other; after the heal every replica converges, nothing
written during the partition is lost, and the evicted sessions rejoin under new ones."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable

from llmfabric.gossip.agent import GossipAgent
from llmfabric.registry.records import Lifecycle

from .conftest import Cluster


async def test_long_partition_on_a_lossy_network_heals_with_nothing_lost(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster(seed=5, delay=(0.001, 0.004), loss=0.05, duplicate=0.02, reorder=0.1)
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(c.converged, within=30)
    first = list(c.agents)
    lo, hi = c.config.suspicion_bounds(len(first))
    rejoined: dict[str, GossipAgent] = {}
    loop = asyncio.get_running_loop()

    def rejoin_on_eviction(old: GossipAgent, i: int) -> None:
        async def rejoin() -> None:  # what a node does: a new session, same key and meta
            await old.aclose()
            new = GossipAgent(old.transport, c.clock, old.owner.signer, old.record.meta,
                              config=c.config, seeds=[a.peer_id for a in first if a is not old],
                              rng=random.Random(100 + i))
            await new.start()
            new.set_state(Lifecycle.SERVING)
            c.agents.append(new)
            rejoined[old.session_id] = new

        old.on_evicted(lambda: loop.create_task(rejoin()) and None)

    for i, a in enumerate(first):
        rejoin_on_eviction(a, i)
    # Both sides hold at least k = 3 members: an eviction needs EVICT facts from 3 distinct
    # authors, so a smaller minority side only suspects (test_hostile_members covers that).
    left, right = first[:3], first[3:]
    c.net.partition([a.peer_id for a in left], [a.peer_id for a in right])
    written = {}
    for i, a in enumerate(first):  # both sides keep writing while cut off
        meta = dataclasses.replace(a.record.meta, provider_id=f"written-in-partition-{i}")
        a.update_self(meta)
        written[a.session_id] = meta.provider_id
    await c.clock.advance(hi + lo)  # longer than any suspicion timeout: evictions happen
    for a in left:  # each side evicted the other side's sessions, and only those
        for b in right:
            assert a.replica.entries[b.session_id].evicted
        assert not any(a.replica.entries[x.session_id].evicted for x in left)
    assert not rejoined  # nobody was told yet: the facts are on the other side
    c.net.heal()

    def healed() -> bool:
        live = c.live()
        return len(rejoined) == len(first) and c.converged(live) and all(
            len([e for e in a.replica.entries.values() if e.state is not Lifecycle.LEFT])
            == len(first) for a in live)

    assert await c.clock.run_until(healed, within=120)
    for a in c.live():
        for sid, provider in written.items():  # the partition-time writes all survived
            entry = a.replica.entries[sid]
            assert entry.state is Lifecycle.LEFT and entry.record is not None
            assert entry.record.record.meta.provider_id == provider
        for new in rejoined.values():  # and every node serves again under a new session
            view = a.nodes.get(new.session_id)
            assert view is not None and view.state is Lifecycle.SERVING
    assert c.net.dropped  # the network really lost messages


async def test_a_side_smaller_than_the_eviction_quorum_only_suspects_the_other(
    make_cluster: Callable[..., Cluster],
) -> None:
    """The documented false negative of the eviction quorum (k = 3): a 2-node minority
    cannot evict the 4-node majority. It stops routing to it (suspected) and, once the
    partition heals, the majority's sessions refute and are routed to again; the majority
    (4 >= k) did evict the minority, whose nodes rejoin under new sessions."""
    c = make_cluster(seed=7, delay=(0.001, 0.004))
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(c.converged, within=30)
    first = list(c.agents)
    lo, hi = c.config.suspicion_bounds(len(first))
    minority, majority = first[:2], first[2:]
    evicted: list[GossipAgent] = []
    for a in first:
        a.on_evicted(lambda a=a: evicted.append(a))
    c.net.partition([a.peer_id for a in minority], [a.peer_id for a in majority])
    await c.clock.advance(hi + lo)
    for a in minority:
        for b in majority:
            e = a.replica.entries[b.session_id]
            assert e.suspected and not e.evicted  # out of routing, not evicted
            assert b.session_id not in {v.session_id for v in a.nodes.routable()}
    for a in majority:
        for b in minority:
            assert a.replica.entries[b.session_id].evicted
    c.net.heal()

    def majority_routed_again() -> bool:
        return all({b.session_id for b in majority} <= {v.session_id for v in a.nodes.routable()}
                   for a in majority)

    assert await c.clock.run_until(majority_routed_again, within=60)
    assert await c.clock.run_until(lambda: set(evicted) == set(minority), within=60)
    assert not any(a.evicted for a in majority)
