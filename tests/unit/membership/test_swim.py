"""SWIM pieces: Lifeguard timeouts, local health, and the indirect probe paths."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS, GossipConfig
from llmfabric.identity.keys import NodeKey
from llmfabric.membership.health import LocalHealth
from llmfabric.registry.records import Lifecycle
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


@given(st.integers(1, 1000), st.integers(0, 20))
def test_lifeguard_timeout_shrinks_with_confirmations_within_bounds(n: int, c: int) -> None:
    cfg = GossipConfig()
    lo, hi = cfg.suspicion_bounds(n)
    t, t_more = cfg.suspicion_timeout(n, c), cfg.suspicion_timeout(n, c + 1)
    assert lo <= t_more <= t <= hi
    assert cfg.suspicion_timeout(n, 1) == pytest.approx(hi)
    assert cfg.suspicion_timeout(n, cfg.expected_confirmations + 1) == pytest.approx(lo)


def test_local_health_is_bounded_and_scales() -> None:
    h = LocalHealth(max_score=3)
    for _ in range(10):
        h.bad()
    assert h.score == 3 and h.scale(1.0) == 4.0
    for _ in range(10):
        h.good()
    assert h.score == 0 and h.scale(1.0) == 1.0


@pytest.fixture
async def trio() -> AsyncIterator[tuple[FakeClock, MemNet, list[GossipAgent]]]:
    clock = FakeClock()
    net = MemNet(clock, seed=1, delay=(0.001, 0.003))
    agents: list[GossipAgent] = []
    for i in range(5):
        key = NodeKey.generate()
        a = GossipAgent(net.transport(key.peer_id), clock, key, config=PRESETS["local"],
                        seeds=[agents[0].peer_id] if agents else [], rng=random.Random(i))
        await a.start()
        a.set_state(Lifecycle.SERVING)
        agents.append(a)
    assert await clock.run_until(
        lambda: len({a.replica.root() for a in agents}) == 1, within=10)
    yield clock, net, agents
    for a in agents:
        await a.aclose()
    await net.aclose()


async def test_a_broken_direct_link_is_bridged_by_indirect_probes(
    trio: tuple[FakeClock, MemNet, list[GossipAgent]],
) -> None:
    clock, net, agents = trio
    a, t = agents[0], agents[1]
    net.cut(a.peer_id, t.peer_id)
    await clock.advance(60.0)
    assert a.prober.stats.indirect > 0  # the direct pings did fail
    assert a.stats.suspicions_raised == 0  # but the helpers' paths carried the acks
    assert all(x.nodes.get(t.session_id).routable for x in agents)  # type: ignore[union-attr]


async def test_all_paths_broken_means_suspicion(
    trio: tuple[FakeClock, MemNet, list[GossipAgent]],
) -> None:
    clock, net, agents = trio
    t = agents[1]
    for x in agents:
        if x is not t:
            net.cut(x.peer_id, t.peer_id)
    assert await clock.run_until(lambda: any(
        x.nodes.get(t.session_id).suspected for x in agents if x is not t),  # type: ignore[union-attr]
        within=10)


class _LaggyClock(FakeClock):
    """Every sleep overshoots by `lag` seconds, like a starved event loop."""

    lag = 0.0

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds + self.lag)


def _prober(clock: FakeClock, heard: dict[str, float]) -> tuple[object, list[object], list[str]]:
    from llmfabric.membership.swim import Member, Prober

    sent: list[object] = []
    suspected: list[str] = []
    members = [Member("target", "pt"), Member("h1", "p1"), Member("h2", "p2")]
    p = Prober(clock, PRESETS["local"], random.Random(0), local_peer="me",
               members=lambda: members, send=lambda peer, msg: sent.append((peer, msg)),
               piggyback=lambda: (), on_suspect=lambda m: suspected.append(m.session_id),
               heard_from=lambda m: heard.get(m.session_id, float("-inf")))
    return p, sent, suspected


async def test_prober_suspects_a_silent_target_after_direct_and_indirect_paths() -> None:
    import asyncio

    from llmfabric.gossip.wire import Ping, PingReq
    from llmfabric.membership.swim import Member

    clock = FakeClock()
    p, sent, suspected = _prober(clock, {})
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    await clock.advance(1.0)
    assert await task is False and suspected == ["target"]
    kinds = [type(m).__name__ for _, m in sent]
    assert kinds == ["Ping", "PingReq", "PingReq"]  # direct, then every other member's path
    assert isinstance(sent[0][1], Ping) and isinstance(sent[1][1], PingReq)


async def test_prober_spares_a_target_it_heard_from() -> None:
    import asyncio

    from llmfabric.membership.swim import Member

    clock = FakeClock()
    heard: dict[str, float] = {}
    p, _, suspected = _prober(clock, heard)
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    await clock.advance(0.1)
    heard["target"] = clock.now()  # e.g. its own ping to us arrived, our ack was lost
    await clock.advance(1.0)
    assert await task is False and suspected == []


async def test_a_starved_prober_pings_again_before_accusing() -> None:
    import asyncio

    from llmfabric.membership.swim import Member

    clock = _LaggyClock()
    clock.lag = 0.3
    p, sent, suspected = _prober(clock, {})
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    await clock.advance(1.2)  # 0.2 s ack timeout + 0.3 s indirect wait, each 0.3 s late
    # the second direct ping went out; an ack to it clears the target
    assert [type(m).__name__ for _, m in sent].count("Ping") == 2
    p.on_ack("pt", sent[0][1].seq)  # type: ignore[attr-defined, union-attr]
    await clock.advance(1.0)
    assert await task is True and suspected == []
    assert p.stats.spared_lag == 1  # type: ignore[attr-defined]


def test_round_robin_covers_everyone_and_takes_in_newcomers() -> None:
    from llmfabric.membership.swim import Member, Prober

    members = [Member(f"s{i}", f"p{i}") for i in range(6)]
    p = Prober(FakeClock(), PRESETS["local"], random.Random(3), local_peer="me",
               members=lambda: members, send=lambda peer, msg: None, piggyback=lambda: (),
               on_suspect=lambda m: None)
    first = [p._next_target() for _ in range(6)]
    assert sorted(m.session_id for m in first if m) == [f"s{i}" for i in range(6)]
    p._next_target()  # a new round has started
    members.append(Member("new", "pn"))
    upcoming = [p._next_target() for _ in range(6)]  # the rest of this round
    assert Member("new", "pn") in upcoming


async def test_an_unhealthy_prober_accuses_nobody() -> None:
    import asyncio

    from llmfabric.membership.swim import Member

    clock = FakeClock()
    p, _, suspected = _prober(clock, {})
    p.health.score = 5  # type: ignore[attr-defined]  # above half of max_health = 8
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    await clock.advance(10.0)
    assert await task is False and suspected == []
    assert p.stats.spared_unhealthy == 1  # type: ignore[attr-defined]


def test_with_a_members_version_the_member_list_is_rescanned_only_on_a_change() -> None:
    from llmfabric.membership.swim import Member, Prober

    members = [Member(f"s{i}", f"p{i}") for i in range(6)]
    version = [0]
    reads = [0]

    def current() -> list[Member]:
        reads[0] += 1
        return members

    p = Prober(FakeClock(), PRESETS["local"], random.Random(3), local_peer="me",
               members=current, send=lambda peer, msg: None, piggyback=lambda: (),
               on_suspect=lambda m: None, members_version=lambda: version[0])
    first = [p._next_target() for _ in range(12)]  # two full rounds
    assert reads[0] == 1
    assert sorted(m.session_id for m in first[:6] if m) == [f"s{i}" for i in range(6)]
    assert sorted(m.session_id for m in first[6:] if m) == [f"s{i}" for i in range(6)]
    members.append(Member("new", "pn"))
    gone = members.pop(0)
    version[0] += 1
    upcoming = [p._next_target() for _ in range(6)]
    assert reads[0] == 2
    assert Member("new", "pn") in upcoming and gone not in upcoming


@pytest.mark.hostile
async def test_only_the_target_or_an_asked_helper_can_ack_a_probe() -> None:
    """A member that acks probes on a dead node's behalf (guessing the sequence number, or
    echoing one it saw) kept it routable: acks count only from the peers that were asked."""
    import asyncio

    from llmfabric.gossip.wire import Ping, PingReq
    from llmfabric.membership.swim import Member

    clock = FakeClock()
    p, sent, suspected = _prober(clock, {})
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    await clock.advance(0.01)
    seq = sent[0][1].seq  # type: ignore[attr-defined, union-attr]
    p.on_ack("p1", seq)  # type: ignore[attr-defined]  # a helper, but not asked yet
    p.on_ack("mallory", seq)  # type: ignore[attr-defined]
    await clock.advance(0.3)  # the direct wait ends: the helpers are asked now
    assert [type(m) for _, m in sent] == [Ping, PingReq, PingReq]
    p.on_ack("mallory", seq)  # type: ignore[attr-defined]
    await clock.advance(1.0)
    assert await task is False and suspected == ["target"]
    assert p.stats.acks_refused == 3  # type: ignore[attr-defined]
    sent.clear()
    task = asyncio.get_running_loop().create_task(p.probe(Member("target", "pt")))  # type: ignore[attr-defined]
    assert await clock.run_until(lambda: len(sent) == 3, within=2.0)  # the helpers asked
    p.on_ack("p2", sent[0][1].seq)  # type: ignore[attr-defined, union-attr]  # asked: counts
    assert await clock.run_until(task.done, within=0.1) and task.result() is True
    assert len({m.seq for _, m in sent}) == 1  # type: ignore[attr-defined]


@pytest.mark.hostile
def test_a_relayed_probe_answers_only_for_its_target_and_one_asker_gets_a_share() -> None:
    from llmfabric.gossip.wire import Ack, Ping, PingReq
    from llmfabric.membership.swim import MAX_RELAYS_PER_ASKER

    clock = FakeClock()
    p, sent, _ = _prober(clock, {})
    p.on_ping_req("asker", PingReq(7, "pt", "target"))  # type: ignore[attr-defined]
    [(to, ping)] = sent
    assert to == "pt" and isinstance(ping, Ping)
    p.on_ack("mallory", ping.seq)  # type: ignore[attr-defined]  # not the target: nothing
    assert len(sent) == 1
    p.on_ack("pt", ping.seq)  # type: ignore[attr-defined]
    assert sent[-1] == ("asker", Ack(7, ()))
    sent.clear()
    for i in range(MAX_RELAYS_PER_ASKER + 5):  # one member floods PING_REQs
        p.on_ping_req("flooder", PingReq(i, "pt", "target"))  # type: ignore[attr-defined]
    assert len(sent) == MAX_RELAYS_PER_ASKER
    assert p.stats.ping_reqs_refused == 5  # type: ignore[attr-defined]
    p.on_ping_req("honest", PingReq(1, "pt", "target"))  # type: ignore[attr-defined]
    assert sent[-1][0] == "pt" and len(sent) == MAX_RELAYS_PER_ASKER + 1
