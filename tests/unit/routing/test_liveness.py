"""DownWatches: a watch fires once, only past the doubt its caller accepted, and leaves nothing
behind; ReplicaCandidateSource fires them from real replica changes (suspicion, eviction,
LEFT), never from a change that keeps the node as live as it was."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, LoadHints, NodeMeta, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.routing.liveness import GONE, LIVE, SUSPECTED, DownWatches
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock

LEVELS = st.sampled_from([LIVE, SUSPECTED, GONE])


@given(
    st.lists(st.tuples(st.sampled_from("abc"), LEVELS), max_size=6),
    st.lists(st.tuples(st.sampled_from("abc"), LEVELS), max_size=12),
    st.sets(st.integers(0, 5)),
)
def test_each_watch_fires_once_past_its_accepted_level_and_unwatching_leaves_nothing(
    watches: list[tuple[str, int]], changes: list[tuple[str, int]], removed_early: set[int]
) -> None:
    down = DownWatches()
    fired: list[list[int]] = [[] for _ in watches]
    unwatch = [
        down.watch(sid, accepted, fired[i].append) for i, (sid, accepted) in enumerate(watches)
    ]
    for i in removed_early:
        if i < len(unwatch):
            unwatch[i]()
    for sid, level in changes:
        down.changed(sid, level)
    for i, (sid, accepted) in enumerate(watches):
        passing = [lv for s, lv in changes if s == sid and lv > accepted]
        expected = [] if i in removed_early or not passing else passing[:1]
        assert fired[i] == expected
    for u in unwatch:
        u()
        u()  # (idempotent)
    assert len(down) == 0 and down.sessions() == []


def _owner(key: NodeKey, clock: FakeClock) -> RecordOwner:
    o = RecordOwner(key, NodeMeta(models=(ServedModel("m"),)), wall=clock.wall())
    o.set_state(Lifecycle.SERVING, wall=clock.wall())
    return o


def test_replica_changes_fire_the_watches_of_the_session_they_touch() -> None:
    clock = FakeClock()
    keys = [NodeKey.generate() for _ in range(3)]
    owners = [_owner(k, clock) for k in keys]
    replica = Replica(clock)
    for o in owners:
        replica.apply(o.current)
    source = ReplicaCandidateSource(lambda: replica)
    by_sid = {c.session_id: c for c in source.candidates("m")}
    a, b = owners[0].session_id, owners[1].session_id
    got: dict[str, list[int]] = {a: [], b: []}
    for sid in (a, b):
        assert source.watch_down(by_sid[sid], got[sid].append) is not None

    replica.apply(
        owners[0].update_meta(
            dataclasses.replace(  # a load hint: still live
                owners[0].record.meta, load=LoadHints(inflight=3)
            ),
            wall=clock.wall(),
        )
    )
    assert got == {a: [], b: []} and len(source.down) == 2
    replica.apply(
        make_fact(keys[2], FactKind.SUSPECT, a, owners[0].record.incarnation, clock.wall())
    )
    assert got == {a: [SUSPECTED], b: []}
    for k in (keys[0], keys[2]):  # a quorum of evictions (min(k, fleet - 1) = 2 authors)
        assert got[b] == []  # (one EVICT fact alone proves nothing)
        replica.apply(make_fact(k, FactKind.EVICT, b, owners[1].record.incarnation, clock.wall()))
    assert got == {a: [SUSPECTED], b: [GONE]} and len(source.down) == 0

    # Picked while already suspected (the router's fallback): only leaving fires it.
    suspected = next(c for c in source.candidates("m") if c.session_id == a)
    assert suspected.suspected
    again: list[int] = []
    source.watch_down(suspected, again.append)
    replica.apply(
        make_fact(keys[1], FactKind.SUSPECT, a, owners[0].record.incarnation, clock.wall())
    )  # a second suspicion: no worse than picked
    assert again == []
    # A candidate list older than the suspicion (a retry of the same request): the replica's
    # level counts, not the stale flag.
    stale: list[int] = []
    source.watch_down(by_sid[a], stale.append)
    assert not by_sid[a].suspected
    applied = replica.applied
    replica.apply(
        make_fact(keys[1], FactKind.SUSPECT, a, owners[0].record.incarnation + 1, clock.wall())
    )  # (one more suspicion: still only suspected)
    assert replica.applied > applied and again == [] and stale == []
    replica.apply(owners[0].set_state(Lifecycle.LEFT, wall=clock.wall()))
    assert again == [GONE] and stale == [GONE] and len(source.down) == 0


def test_a_replica_switch_fires_the_watches_of_sessions_the_new_replica_lacks() -> None:
    clock = FakeClock()
    keys = [NodeKey.generate() for _ in range(2)]
    owners = [_owner(k, clock) for k in keys]
    old, new = Replica(clock), Replica(clock)
    for o in owners:
        old.apply(o.current)
    new.apply(owners[1].current)  # (our node rejoined: its new replica lacks owners[0])
    current = [old]
    source = ReplicaCandidateSource(lambda: current[0])
    cands = {c.session_id: c for c in source.candidates("m")}
    got: dict[str, list[int]] = {o.session_id: [] for o in owners}
    for sid, cand in cands.items():
        source.watch_down(cand, got[sid].append)
    current[0] = new
    source.candidates("m")
    assert got == {owners[0].session_id: [GONE], owners[1].session_id: []}
    assert source.down.sessions() == [owners[1].session_id]
