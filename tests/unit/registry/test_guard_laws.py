"""Laws of the replica's hostile-input gate (hypothesis): whatever fewer than k members sign,
in any order and with any incarnations or timestamps, no honest session is evicted, no entry
appears for a session nobody published, and the per-entry evidence stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.guard import TrustConfig
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import Replica, item_parts
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.members import joined

pytestmark = pytest.mark.hostile

HONEST = [NodeKey.generate() for _ in range(4)]
ATTACKERS = [NodeKey.generate() for _ in range(2)]  # k - 1 colluders
FAKE_SIDS = ["f" * 32, "0" * 32, "not-a-session"]

attacks = st.lists(st.tuples(
    st.sampled_from([FactKind.SUSPECT, FactKind.EVICT]),
    st.integers(0, 1),  # which attacker
    st.integers(0, 3 + len(FAKE_SIDS) - 1),  # target: an honest session or a made-up one
    st.one_of(st.integers(0, 3), st.just(2**63 - 1), st.integers(0, 2**63 - 1)),
    st.floats(-3600, 3000, allow_nan=False),  # issued_at offset
), max_size=60)


@settings(max_examples=120, deadline=None)
@given(attacks)
def test_fewer_than_k_members_evict_nobody_whatever_they_sign(
    plan: list[tuple[FactKind, int, int, int, float]],
) -> None:
    clock = FakeClock()
    rep = Replica(clock, trust=TrustConfig(eviction_quorum=3))
    owners = [RecordOwner(k, NodeMeta(), wall=clock.wall()) for k in HONEST]
    for o in owners:
        rep.apply(o.set_state(Lifecycle.SERVING, wall=clock.wall()))
    for k in ATTACKERS:
        joined(rep, clock.wall(), k)
    before = set(rep.entries)
    for kind, who, target, inc, dt in plan:
        sid = owners[target].session_id if target < len(owners) else FAKE_SIDS[
            target - len(owners)]
        fact = make_fact(ATTACKERS[who], kind, sid, inc, clock.wall() + dt)
        rep.ingest(*item_parts(fact))
        # owners refute what they see, as the agent does
        for o in owners:
            e = rep.entries[o.session_id]
            if e.suspected:
                rep.apply(o.refute(e.max_suspect_incarnation, wall=clock.wall()))
    assert set(rep.entries) == before  # no entry for made-up sessions
    for o in owners:
        e = rep.entries[o.session_id]
        assert not e.evicted and e.state is Lifecycle.SERVING
        assert not e.suspected  # every suspicion was refutable
        assert e.incarnation <= 2 * len(plan) + 1  # refutations never ran away
        assert len(e.evicts) <= rep.trust.max_evicts_per_entry
