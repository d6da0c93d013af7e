"""The fleet of tests/e2e/test_partition.py on the fake clock: two sides of an ingress and a
provider each, cut apart for 30 s, then healed. What must hold (docs/security.md, "Partitions"):
nothing honest is evicted for good, no session has to rejoin, and after the heal every
original session is routable again on every replica, under its own session id.

Found here (it failed on main): EVICT facts about an incarnation the owner had refuted
stayed in the replica as evidence, and when the fleet shrank (one node left, so the quorum
cap fell from 3 to 2) they became decisive and evicted every session in cascade."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmfabric.gossip.agent import GossipAgent
from llmfabric.registry.records import Lifecycle

from .conftest import Cluster

CUT_S = 30.0


async def _two_sides(c: Cluster) -> tuple[list[GossipAgent], list[GossipAgent]]:
    ia = await c.add()
    pa = await c.add(seeds=[ia.peer_id])
    ib = await c.add(seeds=[ia.peer_id])
    pb = await c.add(seeds=[ib.peer_id])
    assert await c.clock.run_until(c.converged, within=30)
    return [ia, pa], [ib, pb]


async def _leave(c: Cluster, agent: GossipAgent) -> None:
    leaving = asyncio.get_running_loop().create_task(agent.leave())
    await c.clock.advance(1)
    await leaving
    await agent.aclose()


def _routable(a: GossipAgent) -> set[str]:
    return {v.session_id for v in a.nodes.routable()}


def _evictions(agents: list[GossipAgent]) -> list[str]:
    told: list[str] = []
    for a in agents:
        a.on_evicted(lambda a=a: told.append(a.session_id))
    return told


async def test_a_departure_after_a_healed_partition_evicts_nobody(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster(seed=1, delay=(0.001, 0.004))
    left, right = await _two_sides(c)
    everyone = left + right
    told = _evictions(everyone)
    c.net.partition([a.peer_id for a in left], [a.peer_id for a in right])
    await c.clock.advance(CUT_S)
    for a in left:  # each side stopped routing to the other (suspected: 2 < k = 3 authors)
        assert _routable(a) == {b.session_id for b in left}
    c.net.heal()
    sessions = {a.session_id for a in everyone}
    assert await c.clock.run_until(
        lambda: c.converged() and all(_routable(a) == sessions for a in everyone), within=30)
    leaver = right[1]
    await _leave(c, leaver)  # the fleet shrinks: the quorum cap falls from 3 to 2
    await c.clock.advance(10)
    stay = [a for a in everyone if a is not leaver]
    for a in stay:
        assert _routable(a) == {b.session_id for b in stay}, "stale evidence evicted"
    assert told == []


async def test_a_side_that_evicted_the_other_during_a_partition_is_refuted_at_the_heal(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A third node on the left side: 3 >= k authors, so the left side evicts the right side
    during the cut (SWIM may: it cannot tell a partition from a crash). At the heal the right
    side's nodes hear of it, are alive, and refute: same sessions, routable everywhere again,
    nobody rejoins, and each side kept routing to its own nodes throughout."""
    c = make_cluster(seed=2, delay=(0.001, 0.004))
    left, right = await _two_sides(c)
    left.append(await c.add(seeds=[left[0].peer_id]))
    assert await c.clock.run_until(c.converged, within=30)
    everyone = left + right
    told = _evictions(everyone)
    c.net.partition([a.peer_id for a in left], [a.peer_id for a in right])
    await c.clock.advance(CUT_S)
    for a in left:
        assert all(a.replica.entries[b.session_id].evicted for b in right)
        assert _routable(a) == {b.session_id for b in left}
    for a in right:
        assert _routable(a) == {b.session_id for b in right}
    c.net.heal()
    sessions = {a.session_id for a in everyone}
    assert await c.clock.run_until(
        lambda: c.converged() and all(_routable(a) == sessions for a in everyone), within=30)
    assert told == [] and not any(a.evicted for a in everyone)
    for a in everyone:
        for b in right:
            e = a.replica.entries[b.session_id]
            assert e.state is Lifecycle.SERVING and e.incarnation >= 1 and not e.evicts
