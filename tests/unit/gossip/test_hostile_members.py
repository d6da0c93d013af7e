"""An admitted member that plays the attacker, on virtual time over the in-memory network.

The attacker holds a real key and a real admitted transport, but runs no honest code: it
signs whatever facts and records it likes and sends them straight to every honest member.
Each test shows that the honest members keep routing to each other and that nothing honest
is evicted. These tests fail on main (281af93): one EVICT from anybody evicted, a SUSPECT at
2**63-1 could not be refuted, facts created entries, one key could publish any number of
sessions.
"""

from __future__ import annotations

import dataclasses
import secrets

import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.wire import Gossip, SyncDeltas, encode
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import sign_record
from llmfabric.registry.facts import Fact, FactKind, make_fact
from llmfabric.registry.guard import TrustConfig
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import (
    Lifecycle,
    LoadHints,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.registry.replica import item_parts

from .conftest import Cluster, MakeCluster

pytestmark = pytest.mark.hostile

HONEST = 6


class Attacker:
    """An admitted member that signs with its own key and sends what it likes."""

    def __init__(self, c: Cluster, *, models: tuple[ServedModel, ...] = ()) -> None:
        self.c = c
        self.key = NodeKey.generate()
        self.transport = c.net.transport(self.key.peer_id)
        self.transport.set_handler(lambda peer, data: None)  # it ignores everybody
        self.owner = RecordOwner(self.key, NodeMeta(provider_id="attacker", models=models),
                                 wall=c.clock.wall())
        self.sid = self.owner.session_id

    def send(self, items: list[tuple[int, bytes, bytes]], *, sync: bool = False) -> None:
        for a in self.c.agents:
            for i in range(0, len(items), 40):  # keep each message under the size limit
                chunk = tuple(items[i:i + 40])
                msg = SyncDeltas(chunk, ()) if sync else Gossip(chunk)
                self.transport.send(a.peer_id, encode(msg, self.sid))

    def join(self) -> None:
        """Publish a SERVING record, so the honest members know it as a member."""
        self.send([item_parts(self.owner.set_state(Lifecycle.SERVING,
                                                   wall=self.c.clock.wall()))])

    def fact(self, kind: FactKind, sid: str, inc: int) -> Fact:
        return make_fact(self.key, kind, sid, inc, self.c.clock.wall())


async def _fleet(make_cluster: MakeCluster) -> tuple[Cluster, list[GossipAgent]]:
    c = make_cluster(delay=(0.001, 0.003))
    for _ in range(HONEST):
        await c.add()
    honest = list(c.agents)
    assert await c.clock.run_until(lambda: c.converged() and all(
        len(a.nodes.routable()) == HONEST for a in honest), within=15)
    return c, honest


def _all_routable(honest: list[GossipAgent]) -> bool:
    """Every honest member routes model "m" to every honest session."""
    want = {a.session_id for a in honest}
    return all(want <= {v.session_id for v in a.models.sessions("m")} for a in honest)


def _nobody_evicted(honest: list[GossipAgent]) -> bool:
    return all(
        a.replica.entries[b.session_id].state is Lifecycle.SERVING and not b.evicted
        for a in honest for b in honest
    )


async def test_a_member_gossiping_evicts_for_everyone_evicts_nobody(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    attackers = [Attacker(c), Attacker(c)]  # two colluding members: still fewer than k = 3
    for att in attackers:
        att.join()
    await c.clock.advance(1.0)
    for att in attackers:
        att.send([item_parts(att.fact(FactKind.EVICT, b.session_id, b.record.incarnation))
                  for b in honest])
        att.send([item_parts(att.fact(FactKind.EVICT, b.session_id, b.record.incarnation + 1))
                  for b in honest])
    _, hi = c.config.suspicion_bounds(HONEST + 2)
    await c.clock.advance(hi + 5.0)  # longer than any suspicion timeout
    assert _nobody_evicted(honest)
    assert _all_routable(honest)
    # the evidence is held (it would count with honest authors'), but decides nothing
    assert all(len(a.replica.entries[b.session_id].evicts) >= 2
               for a in honest for b in honest if a is not b)
    assert all(a.stats.loop_errors == 0 for a in honest)


async def test_a_really_dead_member_is_still_evicted_by_the_quorum(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    victim = honest[2]
    await c.kill(victim)
    others = [a for a in honest if a is not victim]
    _, hi = c.config.suspicion_bounds(HONEST)
    assert await c.clock.run_until(lambda: all(
        a.replica.entries[victim.session_id].state is Lifecycle.LEFT for a in others),
        within=hi + 10)
    entry = others[0].replica.entries[victim.session_id]
    assert entry.evict is not None
    authors = {f.author for f in entry.evicts if f.incarnation == entry.evict.incarnation}
    assert len(authors) >= c.config.trust.eviction_quorum  # evidence from 3 distinct members


async def test_a_suspicion_at_the_largest_incarnation_is_refused_and_nobody_is_evicted(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    att = Attacker(c)
    att.join()
    await c.clock.advance(1.0)
    att.send([item_parts(att.fact(kind, b.session_id, 2**63 - 1))
              for b in honest for kind in (FactKind.SUSPECT, FactKind.EVICT)])
    _, hi = c.config.suspicion_bounds(HONEST + 1)
    await c.clock.advance(hi + 5.0)
    assert _nobody_evicted(honest) and _all_routable(honest)
    assert all(a.record.incarnation < 2**62 for a in honest)  # nothing forced it up
    assert all(not a.replica.entries[b.session_id].suspected for a in honest for b in honest)


async def test_suspicions_the_owner_can_refute_do_not_stop_routing(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    att = Attacker(c)
    att.join()
    await c.clock.advance(1.0)
    for _ in range(20):  # re-suspect everyone at its newest incarnation, again and again
        att.send([item_parts(att.fact(FactKind.SUSPECT, b.session_id, b.record.incarnation))
                  for b in honest])
        await c.clock.advance(2.0)
    await c.clock.advance(c.config.suspicion_bounds(HONEST + 1)[1])
    assert _nobody_evicted(honest)
    assert await c.clock.run_until(lambda: _all_routable(honest), within=2.0)


async def test_facts_about_sessions_nobody_published_create_no_entries(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    att = Attacker(c)
    att.join()
    await c.clock.advance(1.0)
    before = {a.peer_id: len(a.replica.entries) for a in honest}
    for _ in range(5):
        fake = [secrets.token_hex(16) for _ in range(200)]
        att.send([item_parts(att.fact(FactKind.SUSPECT, sid, 0)) for sid in fake])
        att.send([item_parts(att.fact(FactKind.EVICT, sid, 0)) for sid in fake], sync=True)
        await c.clock.advance(0.5)
    await c.clock.advance(5.0)
    assert all(len(a.replica.entries) == before[a.peer_id] for a in honest)
    assert all(len(a._last_heard) <= HONEST + 1 for a in honest)
    assert all(len(a.queue) <= a.config.max_queued for a in honest)
    assert _all_routable(honest)


async def test_a_thousand_sessions_under_one_key_are_capped(make_cluster: MakeCluster) -> None:
    c, honest = await _fleet(make_cluster)
    att = Attacker(c, models=(ServedModel("m"),))
    records = []
    for _ in range(1000):
        o = RecordOwner(att.key, att.owner.record.meta, wall=c.clock.wall())
        records.append(item_parts(o.set_state(Lifecycle.SERVING, wall=c.clock.wall())))
    att.send(records)
    await c.clock.advance(10.0)
    cap = 8  # TrustConfig().max_sessions_per_peer
    for a in honest:
        # at most `cap` at once (the attacker answers no probe: those get evicted, and later
        # copies may take their place, never more than `cap` alive together)
        mine = [v for v in a.nodes.all(include_left=False) if v.record.peer_id == att.key.peer_id]
        assert len(mine) <= cap
        cands = a.models.sessions("m")
        assert sum(v.record.peer_id == att.key.peer_id for v in cands) <= cap
    assert _all_routable(honest)


async def test_sessions_born_left_under_one_key_are_capped_too(make_cluster: MakeCluster
                                                               ) -> None:
    """A record born LEFT is not live, so the live cap let one key store 3,000 of them
    (15 KB each: 110 MB for a day, spread by gossip, with quadratic bookkeeping per key).
    Sessions held per peer, in any state, are capped."""
    from llmfabric.registry.guard import TrustConfig

    c, honest = await _fleet(make_cluster)
    att = Attacker(c, models=(ServedModel("m"),))
    att.join()
    cap = TrustConfig().max_held_sessions_per_peer
    records = []
    for _ in range(cap + 100):
        o = RecordOwner(att.key, att.owner.record.meta, wall=c.clock.wall())
        records.append(item_parts(o.set_state(Lifecycle.LEFT, wall=c.clock.wall())))
    for i in range(0, len(records), 50):
        att.send(records[i:i + 50])
    await c.clock.advance(10.0)
    for a in honest:
        mine = [s for s, e in a.replica.entries.items()
                if e.record is not None and e.record.record.peer_id == att.key.peer_id]
        assert len(mine) <= cap
        assert a.replica.rejected["sessions_held"] >= 100
    assert _all_routable(honest)


async def test_a_forged_record_for_an_honest_session_never_enters(
    make_cluster: MakeCluster,
) -> None:
    c, honest = await _fleet(make_cluster)
    att = Attacker(c)
    att.join()
    victim = honest[0]
    # the attacker re-signs the victim's record as LEFT with its own key: refused, the session
    # id is bound to the victim's key
    rec: NodeRecord = dataclasses.replace(victim.record, state=Lifecycle.LEFT, version=10**6,
                                          peer_id=att.key.peer_id,
                                          public_key=att.key.public_bytes)
    with pytest.raises(Exception, match="not minted for this key"):
        sign_record(att.key, rec)
    await c.clock.advance(2.0)
    assert _nobody_evicted(honest) and _all_routable(honest)


async def test_a_member_posing_as_another_provider_gets_none_of_its_traffic(
    make_cluster: MakeCluster,
) -> None:
    """A certificate network: `my-lab`'s node holds a certificate naming my-lab; the attacker,
    certified as `evil`, claims provider_id my-lab with 500 sessions serving the model."""
    import random

    from llmfabric.identity.admission import sign_membership
    from llmfabric.ingress.sources import RecordsCandidateSource
    from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
    from llmfabric.routing import Router, make_policy, route_request
    from llmfabric.routing.router import NoRoute

    c = make_cluster(delay=(0.001, 0.003))
    operator = NodeKey.generate()
    verifier = ProviderVerifier(operator.public_bytes, "net", c.clock.wall)
    model = (ServedModel("m"),)

    def cert(key: NodeKey, provider: str) -> str:
        return sign_membership(operator, key.peer_id, "net", c.clock.wall() + 86400,
                               provider=provider).to_json()

    for i in range(4):
        key = NodeKey.generate()
        name = "my-lab" if i == 1 else f"uni-{i}"
        agent = GossipAgent(c.net.transport(key.peer_id), c.clock, key,
                            NodeMeta(provider_id=name, models=model, cert=cert(key, name)),
                            config=c.config, seeds=[a.peer_id for a in c.agents[:1]],
                            rng=random.Random(i), policy=CertRecordPolicy(verifier))
        await agent.start()
        agent.set_state(Lifecycle.SERVING)
        c.agents.append(agent)
    honest = list(c.agents)
    assert await c.clock.run_until(lambda: all(
        len(a.nodes.routable()) == 4 for a in honest), within=15)
    att = Attacker(c, models=model)
    meta = NodeMeta(provider_id="my-lab", models=model, cert=cert(att.key, "evil"))
    att.send([item_parts(RecordOwner(att.key, meta, wall=c.clock.wall()).set_state(
        Lifecycle.SERVING, wall=c.clock.wall())) for _ in range(500)])
    # and a key the operator never certified, claiming my-lab too
    stranger = Attacker(c, models=model)
    stranger.owner = RecordOwner(stranger.key, dataclasses.replace(meta, cert=""),
                                 wall=c.clock.wall())
    stranger.join()
    await c.clock.advance(5.0)
    router = Router(make_policy("random", random.Random(0)))
    req = route_request("m", providers_header="my-lab")
    for a in honest:
        source = RecordsCandidateSource(
            lambda a=a: [(v.record, v.suspected) for v in a.nodes.all(include_left=False)],
            identify=verifier.identity)
        cands = source.candidates("m")
        assert sum(x.peer_id == att.key.peer_id for x in cands) <= 8  # capped, not 500
        assert not any(x.peer_id == stranger.key.peer_id for x in cands)  # no certificate
        assert a.stats.rejected["cert"] >= 1
        for attempt in range(20):
            d = router.route(req, cands, [], attempt)
            assert not isinstance(d, NoRoute)
            assert d.candidate.peer_id == honest[1].peer_id


# ---- a member re-signing its record in a loop ---------------------------------------------
# 2 x 200 adapter names: a 13 KB record, near the largest a replica takes (MAX_BODY_BYTES)
BIG = tuple(ServedModel(m, adapters=tuple(f"adapter-{i:04d}-{'x' * 16}" for i in range(200)))
            for m in ("m", "m2"))


async def _flood(make_cluster: MakeCluster, trust: TrustConfig
                 ) -> tuple[int, Cluster, list[GossipAgent], Attacker]:
    """The attacker sends 300 versions of a 13 KB record to one honest member over 10 s;
    returns the bytes the honest fleet sent from the flood's start until 30 s after it."""
    c = make_cluster(delay=(0.001, 0.003))
    c.config = dataclasses.replace(c.config, trust=trust)
    for _ in range(HONEST):
        await c.add()
    honest = list(c.agents)
    att = Attacker(c, models=BIG)
    att.join()
    assert await c.clock.run_until(lambda: c.converged(), within=15)
    start = sum(a.stats.bytes_out for a in honest)
    for i in range(300):
        meta = dataclasses.replace(att.owner.record.meta, load=LoadHints(inflight=i))
        rec = att.owner.update_meta(meta, wall=c.clock.wall())
        att.transport.send(honest[0].peer_id, encode(Gossip((item_parts(rec),)), att.sid))
        await c.clock.advance(1 / 30)
    await c.clock.advance(30.0)
    return sum(a.stats.bytes_out for a in honest) - start, c, honest, att


def _versions_held(honest: list[GossipAgent], att: Attacker) -> set[bytes]:
    return {a.replica.entries[att.sid].record.signature  # type: ignore[union-attr]
            for a in honest}


async def test_a_member_re_signing_its_record_in_a_loop_is_rate_limited(
        make_cluster: MakeCluster) -> None:
    """Every new version of a record is stored and relayed by every replica: 300 versions of
    a 13 KB record sent to one member made a 6-node fleet send 68 MB. New versions per peer
    now pass a byte bucket at each replica, so the flood stops at the first hop."""
    unlimited = TrustConfig(record_bytes_per_s=1e12, record_burst_bytes=1e12)
    sent_before, *_ = await _flood(make_cluster, unlimited)
    sent, c, honest, att = await _flood(make_cluster, TrustConfig())
    assert honest[0].replica.rejected["record_rate_limited"] > 200
    assert sent * 4 < sent_before  # (measured: 10 MB against 68 MB)
    assert len(_versions_held(honest, att)) == 1  # the fleet still agrees on one version
    assert _all_routable(honest) and _nobody_evicted(honest)
    # once it stops, its next version is heard by everybody again
    await c.clock.advance(60.0)
    meta = dataclasses.replace(att.owner.record.meta, load=LoadHints(inflight=1000))
    rec = att.owner.update_meta(meta, wall=c.clock.wall())
    att.transport.send(honest[0].peer_id, encode(Gossip((item_parts(rec),)), att.sid))
    await c.clock.advance(10.0)
    assert _versions_held(honest, att) == {rec.signature}


async def test_honest_members_republishing_their_load_are_never_rate_limited(
        make_cluster: MakeCluster) -> None:
    """Honest nodes republish when load hints, spend or key grants change: at most about
    three versions a second. A minute of that, from every member at once, is never refused
    and every member sees every other's newest load."""
    c, honest = await _fleet(make_cluster)
    for step in range(180):
        for a in honest:
            meta = dataclasses.replace(a.record.meta, load=LoadHints(inflight=step))
            a.update_self(meta)
        await c.clock.advance(1 / 3)
    assert await c.clock.run_until(lambda: c.converged(), within=10)
    assert all(a.replica.rejected["record_rate_limited"] == 0 for a in honest)
    assert all(v.record.meta.load.inflight == 179
               for a in honest for v in a.nodes.all(include_left=False))
