"""Gossip + SWIM on virtual time over the in-memory network."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmfabric.gossip.agent import GossipAgent
from llmfabric.registry.records import Lifecycle

from .conftest import Cluster


async def test_join_propagates_and_replicas_converge(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.005))
    for _ in range(8):
        await c.add()
    assert await c.clock.run_until(
        lambda: all(len(a.nodes.routable()) == 8 for a in c.agents), within=10)
    assert await c.clock.run_until(c.converged, within=10)
    sids = {a.session_id for a in c.agents}
    for a in c.agents:
        assert {v.session_id for v in a.models.sessions("alias")} == sids


async def test_dead_node_is_suspected_then_evicted(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(lambda: c.converged() and all(
        len(a.nodes.routable()) == 6 for a in c.agents), within=10)
    victim = c.agents[3]
    await c.kill(victim)
    others = [a for a in c.agents if a is not victim]

    def not_routable() -> bool:
        return all(victim.session_id not in {v.session_id for v in a.nodes.routable()}
                   for a in others)

    assert await c.clock.run_until(not_routable, within=5)
    # nothing irreversible yet: suspected, not LEFT
    assert all(a.nodes.get(victim.session_id).state is Lifecycle.SERVING  # type: ignore[union-attr]
               for a in others)
    _lo, hi = c.config.suspicion_bounds(6)
    assert await c.clock.run_until(lambda: all(
        a.nodes.get(victim.session_id).state is Lifecycle.LEFT  # type: ignore[union-attr]
        for a in others), within=hi + 5)
    assert sum(a.stats.evictions_issued for a in others) >= 1
    assert all(a.stats.loop_errors == 0 for a in others)


async def test_suspected_live_node_refutes(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(5):
        await c.add()
    assert await c.clock.run_until(lambda: c.converged() and all(
        len(a.nodes.routable()) == 5 for a in c.agents), within=10)
    target, accuser = c.agents[2], c.agents[0]
    inc0 = target.record.incarnation
    m = next(m for m in accuser.members() if m.session_id == target.session_id)
    accuser._suspect(m)  # a false suspicion (e.g. after lost acks)
    assert await c.clock.run_until(lambda: target.record.incarnation > inc0, within=3)
    assert await c.clock.run_until(lambda: all(
        not a.nodes.get(target.session_id).suspected for a in c.agents), within=3)  # type: ignore[union-attr]
    await c.clock.advance(c.config.suspicion_bounds(5)[1] + 2)
    assert all(a.nodes.get(target.session_id).state is Lifecycle.SERVING  # type: ignore[union-attr]
               for a in c.agents)
    assert not target.evicted and target.stats.refutations >= 1


async def test_partition_heals_and_nothing_is_lost(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    left, right = c.agents[:3], c.agents[3:]
    c.net.partition([a.peer_id for a in left], [a.peer_id for a in right])
    # each side keeps writing while cut off; less than the suspicion timeout so no evictions
    for i, a in enumerate(c.agents):
        a.update_self(a.record.meta.__class__(provider_id=f"changed{i}"))
    await c.clock.advance(1.0)
    assert not c.converged()
    c.net.heal()
    assert await c.clock.run_until(c.converged, within=20)
    for a in c.agents:
        for b in c.agents:
            assert a.nodes.get(b.session_id).record.meta.provider_id == b.record.meta.provider_id  # type: ignore[union-attr]


async def test_graceful_leave_reaches_everyone(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(6):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    leaver = c.agents[4]
    leaving = asyncio.get_running_loop().create_task(leaver.leave())
    await c.clock.advance(c.config.gossip_interval_s * 2)
    await leaving
    await leaver.aclose()
    c.net.kill(leaver.peer_id)
    assert await c.clock.run_until(lambda: all(
        a.nodes.get(leaver.session_id).state is Lifecycle.LEFT  # type: ignore[union-attr]
        for a in c.agents if a is not leaver), within=2)
    assert sum(a.stats.evictions_issued for a in c.agents) == 0


async def test_an_evicted_node_that_is_alive_refutes_and_keeps_its_session(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(4):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    victim = c.agents[1]
    told: list[bool] = []
    victim.on_evicted(lambda: told.append(True))
    c.net.partition([victim.peer_id])  # cut off long enough to be evicted
    hi = c.config.suspicion_bounds(4)[1]
    assert await c.clock.run_until(lambda: all(
        a.nodes.get(victim.session_id).state is Lifecycle.LEFT  # type: ignore[union-attr]
        for a in c.agents if a is not victim), within=hi + 5)
    c.net.heal()
    # it hears of its eviction, is alive, and publishes a higher incarnation: the same
    # session is SERVING on every replica again, and nobody had to rejoin
    assert await c.clock.run_until(lambda: c.converged() and all(
        a.nodes.get(victim.session_id).state is Lifecycle.SERVING  # type: ignore[union-attr]
        for a in c.agents), within=30)
    assert told == [] and not victim.evicted
    assert victim.stats.evictions_refuted >= 1 and victim.record.incarnation >= 1


async def test_load_hint_updates_are_minor_but_still_converge(
    make_cluster: Callable[..., Cluster],
) -> None:
    import dataclasses

    from llmfabric.gossip.changes import is_minor
    from llmfabric.registry.records import LoadHints

    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(8):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    a = c.agents[3]
    changes = []
    a.add_listener(changes.append)
    a.update_self(dataclasses.replace(a.record.meta, load=LoadHints(inflight=5)))
    assert is_minor(changes[-1])
    a.update_self(dataclasses.replace(a.record.meta, provider_id="other"))
    assert not is_minor(changes[-1])
    a.update_self(dataclasses.replace(a.record.meta, load=LoadHints(inflight=7)))
    assert await c.clock.run_until(lambda: all(
        b.nodes.get(a.session_id).record.meta.load.inflight == 7  # type: ignore[union-attr]
        for b in c.agents), within=10)


async def test_restarted_node_old_session_is_evicted_new_one_serves(
    make_cluster: Callable[..., Cluster],
) -> None:
    import random

    from llmfabric.gossip.agent import GossipAgent
    from llmfabric.identity.keys import NodeKey

    c = make_cluster(delay=(0.001, 0.003))
    key = NodeKey.generate()
    for _ in range(4):
        await c.add()
    old = GossipAgent(c.net.transport(key.peer_id), c.clock, key, config=c.config,
                      seeds=[c.agents[0].peer_id], rng=random.Random(1))
    await old.start()
    old.set_state(Lifecycle.SERVING)
    assert await c.clock.run_until(lambda: all(
        a.nodes.get(old.session_id) is not None for a in c.agents), within=5)
    await old.aclose()  # crash, then restart with the same key (same peer id), new session
    new = GossipAgent(c.net.transport(key.peer_id), c.clock, key, config=c.config,
                      seeds=[c.agents[0].peer_id], rng=random.Random(2))
    await new.start()
    new.set_state(Lifecycle.SERVING)
    c.agents.append(new)
    hi = c.config.suspicion_bounds(6)[1]
    assert await c.clock.run_until(lambda: all(
        a.nodes.get(old.session_id).state is Lifecycle.LEFT  # type: ignore[union-attr]
        and a.nodes.get(new.session_id).routable  # type: ignore[union-attr]
        for a in c.agents), within=hi + 5)


async def test_last_seen_follows_messages_not_only_record_changes(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster("local")
    a = await c.add()
    b = await c.add()
    assert await c.clock.run_until(c.converged, within=10.0)
    await c.clock.advance(30.0)  # no record changes, only probes and syncs
    view = a.nodes.get(b.session_id)
    assert view is not None
    assert c.clock.now() - view.last_seen < 5.0
    assert view.record.version == b.record.version  # nothing changed, yet b was heard from


async def test_cached_member_list_follows_joins_leaves_and_evictions(
    make_cluster: Callable[..., Cluster],
) -> None:
    """members()/member_peers() are cached between membership changes; after every kind of
    change they must equal a recomputation from the replica (and survive other changes)."""
    import dataclasses

    from llmfabric.registry.records import LoadHints

    c = make_cluster(delay=(0.001, 0.003))

    def fresh(a: GossipAgent) -> set[str]:
        return {sid for sid, e in a.replica.entries.items()
                if e.record is not None and e.state is not Lifecycle.LEFT
                and sid != a.session_id}

    def consistent() -> bool:
        return all({m.session_id for m in a.members()} == fresh(a)
                   and a.member_peers() == sorted({m.peer_id for m in a.members()})
                   for a in c.live())

    for _ in range(5):
        await c.add()
    assert await c.clock.run_until(c.converged, within=10)
    assert consistent() and all(len(a.members()) == 4 for a in c.agents)
    c.agents[0].member_peers().clear()  # callers get their own list
    assert len(c.agents[0].member_peers()) == 4
    c.agents[2].update_self(dataclasses.replace(c.agents[2].record.meta,
                                                load=LoadHints(inflight=3)))
    await c.clock.advance(1)
    assert consistent()
    late = await c.add()  # a join
    assert await c.clock.run_until(lambda: all(len(a.members()) == 5 for a in c.agents),
                                   within=10)
    assert consistent()
    leaving = asyncio.get_running_loop().create_task(late.leave())  # a graceful leave
    await c.clock.advance(c.config.gossip_interval_s * 2)
    await leaving
    await late.aclose()
    c.net.kill(late.peer_id)
    assert await c.clock.run_until(lambda: all(len(a.members()) == 4 for a in c.live()),
                                   within=5)
    assert consistent()
    victim = c.agents[1]  # an eviction
    await c.kill(victim)
    hi = c.config.suspicion_bounds(5)[1]
    assert await c.clock.run_until(lambda: all(
        victim.session_id not in {m.session_id for m in a.members()} for a in c.live()),
        within=hi + 5)
    assert consistent()
