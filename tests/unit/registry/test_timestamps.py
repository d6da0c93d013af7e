"""Timestamps are bounded: non-finite and far-future items never enter a replica (an EVICT
with issued_at = inf would never be collected), and every refusal is counted."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.errors import RegistryError
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import GcConfig, Replica, item_parts
from llmfabric.registry.views import NodeRegistry
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.members import joined

OWNER, MEMBER = NodeKey.generate(), NodeKey.generate()


def _serving(clock: FakeClock, rep: Replica) -> RecordOwner:
    own = RecordOwner(OWNER, NodeMeta(), wall=clock.wall())
    assert rep.ingest(*item_parts(own.set_state(Lifecycle.SERVING, wall=clock.wall())))
    joined(rep, clock.wall(), MEMBER)  # a 2-peer fleet: one EVICT is a quorum
    return own


@pytest.mark.parametrize(
    ("offset", "reason"),
    [(math.inf, "bad_timestamp"), (-math.inf, "bad_timestamp"), (7200.0, "future"),
     (1e12, "future")],
)
def test_an_evict_fact_with_an_unbounded_timestamp_never_enters(
    offset: float, reason: str
) -> None:
    clock = FakeClock()
    rep = Replica(clock)
    own = _serving(clock, rep)
    bad = make_fact(MEMBER, FactKind.EVICT, own.session_id, 0, clock.wall() + offset)
    assert rep.ingest(*item_parts(bad)) is None
    assert rep.rejected == Counter({reason: 1})
    view = NodeRegistry(rep).get(own.session_id)
    assert view is not None and view.state is Lifecycle.SERVING  # not evicted


@pytest.mark.parametrize(("offset", "reason"), [(math.inf, "bad_timestamp"), (7200.0, "future")])
def test_records_with_unbounded_timestamps_never_enter(offset: float, reason: str) -> None:
    clock = FakeClock()
    rep = Replica(clock)
    own = RecordOwner(OWNER, NodeMeta(), wall=clock.wall())
    left = own.set_state(Lifecycle.LEFT, wall=clock.wall() + offset)
    assert rep.ingest(*item_parts(left)) is None
    assert own.session_id not in rep.entries and rep.rejected[reason] == 1


async def test_skew_within_the_bound_is_accepted_and_gc_still_happens() -> None:
    clock = FakeClock()
    gc = GcConfig(retention_s=100.0, tombstone_ttl_s=100.0, max_record_age_s=150.0,
                  refresh_interval_s=10.0, max_clock_skew_s=60.0)
    rep = Replica(clock, gc)
    own = _serving(clock, rep)
    ahead = make_fact(MEMBER, FactKind.EVICT, own.session_id, 0, clock.wall() + 59.0)
    assert rep.ingest(*item_parts(ahead)) is not None  # a clock 59 s ahead is tolerated
    assert rep.entries[own.session_id].state is Lifecycle.LEFT
    # GC is delayed by the skew at most: compacted by 59 + retention, dropped after the TTL
    await clock.advance(160.0)
    rep.collect()
    assert own.session_id not in rep.entries and own.session_id in rep.tombstones
    await clock.advance(100.0)
    rep.collect()
    assert own.session_id not in rep.tombstones and own.session_id not in rep.entries


def test_refusals_count_into_a_shared_counter() -> None:
    shared: Counter[str] = Counter()
    clock = FakeClock()
    for _ in range(2):  # e.g. the replicas of two successive sessions of one node
        rep = Replica(clock, rejected=shared)
        own = _serving(clock, rep)
        rep.ingest(*item_parts(make_fact(MEMBER, FactKind.EVICT, own.session_id, 0, math.inf)))
    assert shared["bad_timestamp"] == 2


def test_the_skew_bound_must_be_finite_and_positive() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(RegistryError, match="max_clock_skew_s"):
            GcConfig(max_clock_skew_s=bad)


@pytest.mark.hostile
async def test_a_backdated_evict_cannot_compact_a_live_session_into_a_tombstone() -> None:
    """A member stamps its EVICT 3 days back (stamps are accepted up to max_record_age_s
    old). The eviction counts from the owner's newest record, not from the claim: the entry
    stays an evicted entry its owner can refute (a listener hears of it), not a tombstone
    that refuses the refutation for days."""
    clock = FakeClock()
    rep = Replica(clock)
    own = _serving(clock, rep)
    record_time = clock.wall()
    await clock.advance(60.0)
    heard: list[str] = []
    rep.add_listener(lambda change: heard.append(change.session_id))
    back = clock.wall() - 3 * 24 * 3600 + 60
    evict = make_fact(MEMBER, FactKind.EVICT, own.session_id, 0, back)
    assert rep.ingest(*item_parts(evict)) is not None
    entry = rep.entries[own.session_id]
    assert entry.state is Lifecycle.LEFT and entry.left_at() == record_time
    assert own.session_id not in rep.tombstones and heard == [own.session_id]
    rep.collect()
    assert own.session_id in rep.entries  # not compacted before the retention passes
    refuted = own.refute(0, wall=clock.wall())  # the owner answers with a higher incarnation
    assert rep.ingest(*item_parts(refuted)) is not None
    assert rep.entries[own.session_id].state is Lifecycle.SERVING
