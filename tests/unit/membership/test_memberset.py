"""MemberSet: a set with O(1) changes and random picks, slots that stay put, forks that share a
base without seeing each other's changes; and the prober's round over it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.gossip.config import PRESETS
from llmfabric.membership.memberset import Member, MemberSet
from llmfabric.membership.swim import Prober
from llmfabric.testing.fake_clock import FakeClock

M = [Member(f"s{i}", f"p{i % 9}") for i in range(20)]
OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 19)), max_size=120)


def _run(ms: MemberSet, ref: set[Member], ops: list[tuple[bool, int]]) -> None:
    for add, i in ops:
        assert (ms.add(M[i]) if add else ms.discard(M[i])) == (
            (M[i] not in ref) if add else (M[i] in ref)
        )
        (ref.add if add else ref.discard)(M[i])


def _same(ms: MemberSet, ref: set[Member]) -> None:
    assert len(ms) == len(ref) and set(ms) == ref and len(list(ms)) == len(ref)
    assert all((m in ms) == (m in ref) for m in M)
    assert {ms.at(i) for i in range(ms.slots())} - {None} == ref


@settings(max_examples=300, deadline=None)
@given(base=st.sets(st.integers(0, 19), max_size=20), ops=OPS, other=OPS)
def test_memberset_is_a_set_and_forks_do_not_leak(
    base: set[int], ops: list[tuple[bool, int]], other: list[tuple[bool, int]]
) -> None:
    shared = MemberSet.shared(M[i] for i in sorted(base))
    a, b = shared.fork(), shared.fork()
    ref_a, ref_b = {M[i] for i in base}, {M[i] for i in base}
    _run(a, ref_a, ops)
    _run(b, ref_b, other)
    _same(a, ref_a)
    _same(b, ref_b)
    _same(shared, {M[i] for i in base})  # the base is untouched


@settings(max_examples=200, deadline=None)
@given(ops=OPS, k=st.integers(0, 5), seed=st.integers(0, 1000))
def test_sample_gives_distinct_peers_outside_the_skip_list(
    ops: list[tuple[bool, int]], k: int, seed: int
) -> None:
    ms, ref = MemberSet(), set()
    _run(ms, ref, ops)
    got = ms.sample(random.Random(seed), k, skip_peers=("p0",))
    peers = [m.peer_id for m in got]
    assert len(set(peers)) == len(peers) and "p0" not in peers and set(got) <= ref
    eligible = {m.peer_id for m in ref} - {"p0"}
    assert len(got) == min(k, len(eligible))  # as many as exist, up to k


def test_slots_stay_put_until_compaction_bumps_the_epoch() -> None:
    many = [Member(f"x{i}", f"q{i}") for i in range(100)]
    ms = MemberSet(many)
    slot_of = {ms.at(i): i for i in range(ms.slots())}
    for m in many[:40]:
        ms.discard(m)
    assert ms.epoch == 0 and all(ms.at(slot_of[m]) == m for m in many[40:])
    for m in many[40:70]:
        ms.discard(m)  # more than half vacant: renumbered
    assert ms.epoch == 1 and set(ms) == set(many[70:]) and ms.slots() == 100 - 51  # at 51


def test_prober_probes_every_member_once_per_round_and_joiners_within_it() -> None:
    clock = FakeClock()
    members = MemberSet(M[:12])
    p = Prober(
        clock,
        PRESETS["local"],
        random.Random(3),
        local_peer="me",
        members=lambda: members,
        send=lambda peer, msg: None,
        piggyback=lambda: (),
        on_suspect=lambda m: None,
        members_version=lambda: len(members),
    )
    first = [p._next_target() for _ in range(6)]
    members.add(M[12])  # joins mid-round
    gone = next(m for m in M[:12] if m not in first)
    members.discard(gone)  # leaves before its turn
    rest = [p._next_target() for _ in range(len(members) - 6)]
    round_ = first + rest
    assert len(set(round_)) == len(round_) == len(members)  # each once, the joiner included
    assert set(round_) == set(members) and gone not in round_ and M[12] in round_
    nxt = [p._next_target() for _ in range(len(members))]  # the next round: all again
    assert set(nxt) == set(members)
