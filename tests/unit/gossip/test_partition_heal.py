"""A partition longer than the suspicion timeouts, on a lossy network (loss, duplication,
reordering): each side evicts the other; after the heal every replica converges, nothing
written during the partition is lost, and the evicted sessions, alive, refute their eviction
and serve again under their own session ids (nobody rejoins)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

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
    told: list[str] = []
    for a in first:
        a.on_evicted(lambda a=a: told.append(a.session_id))
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
    c.net.heal()
    sessions = {a.session_id for a in first}

    def healed() -> bool:
        return c.converged() and all(
            {v.session_id for v in a.nodes.routable()} == sessions for a in first)

    assert await c.clock.run_until(healed, within=120)
    assert told == []  # every eviction was refuted by its owner: no rejoin
    for a in first:
        for sid, provider in written.items():  # the partition-time writes all survived
            entry = a.replica.entries[sid]
            assert entry.state is Lifecycle.SERVING and entry.record is not None
            assert entry.record.record.meta.provider_id == provider
    assert c.net.dropped  # the network really lost messages


async def test_a_side_smaller_than_the_eviction_quorum_only_suspects_the_other(
    make_cluster: Callable[..., Cluster],
) -> None:
    """The documented false negative of the eviction quorum (k = 3): a 2-node minority
    cannot evict the 4-node majority. It stops routing to it (suspected) and, once the
    partition heals, the majority's sessions refute and are routed to again; the majority
    (4 >= k) did evict the minority, whose nodes refute that too and keep their sessions."""
    c = make_cluster(seed=7, delay=(0.001, 0.004))
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(c.converged, within=30)
    first = list(c.agents)
    lo, hi = c.config.suspicion_bounds(len(first))
    minority, majority = first[:2], first[2:]
    evicted: list[str] = []
    for a in first:
        a.on_evicted(lambda a=a: evicted.append(a.session_id))
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
    sessions = {a.session_id for a in first}
    assert await c.clock.run_until(lambda: all(
        {v.session_id for v in a.nodes.routable()} == sessions for a in first), within=60)
    assert evicted == [] and not any(a.evicted for a in first)
