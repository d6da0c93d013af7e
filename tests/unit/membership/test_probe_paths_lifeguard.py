"""Exactly k = 3 indirect probes when more helpers exist; and Lifeguard on a running
suspicion tracker: the eviction timeout shrinks as independent confirmations arrive."""

from __future__ import annotations

import asyncio
import math
import random

from llmfabric.gossip.config import PRESETS
from llmfabric.gossip.wire import Message, Ping, PingReq
from llmfabric.identity.keys import NodeKey
from llmfabric.membership.suspicion import SuspicionTracker
from llmfabric.membership.swim import Member, Prober
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import NodeMeta
from llmfabric.registry.replica import Replica
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.members import joined


async def test_exactly_k_ping_reqs_to_distinct_helpers_when_more_exist() -> None:
    clock = FakeClock()
    cfg = PRESETS["local"]
    assert cfg.indirect_probes == 3
    members = [Member("target", "pt")] + [Member(f"h{i}", f"p{i}") for i in range(6)]
    members.append(Member("own-other-session", "me"))  # our own peer never helps
    sent: list[tuple[str, Message]] = []
    for seed in range(5):
        sent.clear()
        p = Prober(clock, cfg, random.Random(seed), local_peer="me",
                   members=lambda: members, send=lambda peer, msg: sent.append((peer, msg)),
                   piggyback=lambda: (), on_suspect=lambda m: None)
        task = asyncio.get_running_loop().create_task(p.probe(members[0]))
        await clock.advance(cfg.probe_interval_s * 2)
        assert await task is False
        reqs = [(peer, m) for peer, m in sent if isinstance(m, PingReq)]
        helpers = {peer for peer, _ in reqs}
        assert len(reqs) == 3 and len(helpers) == 3, sent
        assert helpers <= {f"p{i}" for i in range(6)}  # not the target, not ourselves
        assert all(m.target_peer == "pt" and m.target_session == "target" for _, m in reqs)
        assert [peer for peer, m in sent if isinstance(m, Ping)] == ["pt"]
        assert p.stats.indirect == 3


async def test_a_running_tracker_evicts_sooner_as_confirmations_arrive() -> None:
    clock = FakeClock()
    cfg = PRESETS["local"]
    n = 10
    lo, hi = cfg.suspicion_bounds(n)
    rep = Replica(clock)
    tracker = SuspicionTracker(clock, cfg)
    rep.add_listener(lambda change: tracker.observe(change.after))
    owner = RecordOwner(NodeKey.generate(), NodeMeta(), wall=clock.wall())
    rep.apply(owner.current)
    sid = owner.session_id
    accusers = [joined(rep, clock.wall()) for _ in range(4)]

    def suspect(i: int) -> None:
        rep.apply(make_fact(accusers[i], FactKind.SUSPECT, sid, 0, clock.wall()))

    def is_due() -> bool:
        return any(e.session_id == sid for e in tracker.due(rep.entries, n))

    suspect(0)  # one suspicion: the timer starts at the Lifeguard maximum
    assert tracker.timeout(rep.entries[sid], n) == hi
    await clock.advance(lo + 0.5)
    assert not is_due()  # past the minimum, but one accuser is not enough
    suspect(1)
    suspect(2)  # two independent confirmations: the timeout shrinks
    t2 = hi - (hi - lo) * math.log(3) / math.log(4)
    assert math.isclose(tracker.timeout(rep.entries[sid], n), t2)
    assert t2 > lo + 0.5
    await clock.advance(t2 - clock.now() - 0.05)
    assert not is_due()
    await clock.advance(0.1)  # now past the shrunk timeout, long before the maximum
    assert clock.now() < hi
    assert is_due()
    assert sid not in tracker.since  # cleared once due: the agent issues one EVICT


async def test_k_confirmations_reach_the_minimum_and_a_refutation_clears() -> None:
    clock = FakeClock()
    cfg = PRESETS["local"]
    n = 10
    lo, _ = cfg.suspicion_bounds(n)
    rep = Replica(clock)
    tracker = SuspicionTracker(clock, cfg)
    rep.add_listener(lambda change: tracker.observe(change.after))
    owner = RecordOwner(NodeKey.generate(), NodeMeta(), wall=clock.wall())
    rep.apply(owner.current)
    sid = owner.session_id
    for _ in range(cfg.expected_confirmations + 1):
        rep.apply(make_fact(joined(rep, clock.wall()), FactKind.SUSPECT, sid, 0,
                            clock.wall()))
    assert tracker.timeout(rep.entries[sid], n) == lo
    await clock.advance(lo / 2)
    rep.apply(owner.refute(0, wall=clock.wall()))  # the owner answers: no eviction at all
    assert sid not in tracker.since
    await clock.advance(lo)
    assert tracker.due(rep.entries, n) == []


def test_probe_next_puts_lost_peers_ahead_of_the_round() -> None:
    clock = FakeClock()
    members = [Member(f"s{i}", f"p{i}") for i in range(20)]
    p = Prober(clock, PRESETS["local"], random.Random(1), local_peer="me",
               members=lambda: members, send=lambda peer, msg: None,
               piggyback=lambda: (), on_suspect=lambda m: None)
    first = p._next_target()
    assert first is not None
    lost = [m for m in members if m != first][7]
    p.probe_next([lost])
    assert p._next_target() == lost  # not in its round-robin turn: next
    seen = {p._next_target() for _ in range(len(members) - 2)}
    assert lost not in seen and len(seen) == len(members) - 2  # the round goes on


async def test_no_more_suspicions_once_k_confirmations_stand() -> None:
    from llmfabric.gossip.agent import GossipAgent
    from llmfabric.testing.memnet import MemNet

    clock = FakeClock()
    net = MemNet(clock)
    target, me = NodeKey.generate(), NodeKey.generate()
    agent = GossipAgent(net.transport(me.peer_id), clock, me, config=PRESETS["local"])
    victim = RecordOwner(target, NodeMeta(), wall=clock.wall())
    agent.replica.apply(victim.current)
    k = agent.config.expected_confirmations
    for _ in range(k + 1):
        agent.replica.apply(make_fact(joined(agent.replica, clock.wall()), FactKind.SUSPECT,
                                      victim.session_id, 0, clock.wall()))
    agent._suspect(Member(victim.session_id, target.peer_id))
    entry = agent.replica.entries[victim.session_id]
    assert len(entry.suspects) == k + 1 and agent.stats.suspicions_spared == 1
    assert agent.stats.suspicions_raised == 0
    await net.aclose()
