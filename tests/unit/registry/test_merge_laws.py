"""Lattice laws of the registry entry join, and lifecycle monotonicity (hypothesis): the
lifecycle never goes back, except that the owner's higher incarnation refutes an eviction."""

from __future__ import annotations

from functools import reduce

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import sign_record
from llmfabric.registry.entry import Entry, entry_of, merge
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord
from llmfabric.registry.signing import new_session_id

KEYS = [NodeKey.generate() for _ in range(3)]
OWNER = KEYS[0]
SID = new_session_id(OWNER.public_bytes)


def _record(state: int, inc: int, ver: int, provider: str) -> Entry:
    rec = NodeRecord(SID, OWNER.peer_id, OWNER.public_bytes, Lifecycle(state), inc, ver,
                     1000.0 + ver, NodeMeta(provider_id=provider))
    return entry_of(sign_record(OWNER, rec))


def _fact(kind: FactKind, author: int, inc: int, t: float) -> Entry:
    return entry_of(make_fact(KEYS[author], kind, SID, inc, t))


records = st.builds(_record, st.integers(0, 3), st.integers(0, 3), st.integers(0, 3),
                    st.sampled_from(["a", "b"]))
suspects = st.builds(_fact, st.just(FactKind.SUSPECT), st.integers(0, 2), st.integers(0, 4),
                     st.just(5.0))
evicts = st.builds(_fact, st.just(FactKind.EVICT), st.integers(1, 2), st.integers(0, 4),
                   st.floats(0, 10))
singletons = st.one_of(records, suspects, evicts)
entries = st.lists(singletons, min_size=1, max_size=5).map(lambda xs: reduce(merge, xs))


@settings(max_examples=150, deadline=None)
@given(entries, entries)
def test_commutative(a: Entry, b: Entry) -> None:
    assert merge(a, b) == merge(b, a)


@settings(max_examples=150, deadline=None)
@given(entries, entries, entries)
def test_associative(a: Entry, b: Entry, c: Entry) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@settings(max_examples=100, deadline=None)
@given(entries)
def test_idempotent(a: Entry) -> None:
    assert merge(a, a) == a


@settings(max_examples=150, deadline=None)
@given(st.lists(singletons, min_size=1, max_size=8))
def test_lifecycle_never_goes_back_and_eviction_sticks_until_refuted(items: list[Entry]) -> None:
    acc = items[0]
    for nxt in items[1:]:
        new = merge(acc, nxt)
        if acc.record is not None:
            assert new.record is not None
            assert new.record.record.order_key() >= acc.record.record.order_key()
        assert new.refuted_below >= acc.refuted_below
        if acc.evict is not None and new.evict is None:
            # only the owner's higher incarnation undoes an eviction (and its evidence)
            assert new.refuted_below > acc.evict.incarnation
            assert all(f.incarnation >= new.refuted_below for f in new.evicts)
        else:
            assert new.state >= acc.state
        acc = new


@settings(max_examples=100, deadline=None)
@given(st.lists(singletons, min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_any_order_converges(items: list[Entry], rnd: object) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert reduce(merge, items) == reduce(merge, shuffled)


def test_refutation_drops_lower_suspicions() -> None:
    e = merge(_record(1, 0, 1, "a"), _fact(FactKind.SUSPECT, 1, 0, 5.0))
    assert e.suspected
    refuted = merge(e, _record(1, 1, 2, "a"))
    assert not refuted.suspected
    # a late copy of the old suspicion does not come back
    assert not merge(refuted, _fact(FactKind.SUSPECT, 2, 0, 6.0)).suspected
    # a suspicion of the new incarnation does
    assert merge(refuted, _fact(FactKind.SUSPECT, 2, 1, 6.0)).suspected


def test_an_eviction_is_refuted_by_the_owner_s_higher_incarnation() -> None:
    e = merge(_record(1, 0, 1, "a"), _fact(FactKind.EVICT, 1, 0, 5.0))
    assert e.state is Lifecycle.LEFT
    assert merge(e, _record(1, 0, 9, "a")).evicted  # a newer version of the same incarnation
    later = merge(e, _record(1, 1, 9, "a"))
    assert later.state is Lifecycle.SERVING and not later.evicted and later.evicts == ()
    # a late copy of the refuted evidence does not come back
    assert not merge(later, _fact(FactKind.EVICT, 2, 0, 6.0)).evicted
    # evidence about the new incarnation does
    assert merge(later, _fact(FactKind.EVICT, 2, 1, 6.0)).evicted
    # a LEFT record (the owner left) is final
    gone = merge(_record(3, 0, 1, "a"), _record(1, 5, 9, "a"))
    assert gone.state is Lifecycle.LEFT


def _merge2(a: Entry, b: Entry) -> Entry:
    return merge(a, b, quorum=2)


# An honest owner never lowers its incarnation as its lifecycle moves on (`records` above
# allows that, and then a suspicion's fate depends on delivery order: pre-existing, rare).
owner_records = st.builds(lambda s, v, p: _record(s, s, v, p), st.integers(0, 3),
                          st.integers(0, 3), st.sampled_from(["a", "b"]))
owner_singletons = st.one_of(owner_records, suspects, evicts)


@settings(max_examples=150, deadline=None)
@given(st.lists(owner_singletons, min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_with_a_quorum_of_two_any_order_converges(items: list[Entry], rnd: object) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = reduce(_merge2, items), reduce(_merge2, shuffled)
    assert a == b
    assert _merge2(a, a) == a


def test_one_evict_decides_nothing_under_a_quorum_of_two_but_two_authors_do() -> None:
    e = _merge2(_record(1, 0, 1, "a"), _fact(FactKind.EVICT, 1, 0, 5.0))
    assert e.state is Lifecycle.SERVING and not e.evicted and len(e.evicts) == 1
    same_author_again = _merge2(e, _fact(FactKind.EVICT, 1, 0, 6.0))
    assert not same_author_again.evicted  # one author, however many facts
    other_incarnation = _merge2(e, _fact(FactKind.EVICT, 2, 1, 6.0))
    assert not other_incarnation.evicted  # two authors, but not about the same incarnation
    done = _merge2(e, _fact(FactKind.EVICT, 2, 0, 6.0))
    assert done.evicted and done.state is Lifecycle.LEFT
    assert _merge2(done, _record(1, 0, 9, "a")).evicted  # until the owner refutes it
    assert not _merge2(done, _record(1, 1, 9, "a")).evicted


def test_the_owner_s_own_evict_decides_alone() -> None:
    e = _merge2(_record(1, 0, 1, "a"), _fact(FactKind.EVICT, 0, 0, 5.0))
    assert e.evicted


def test_an_evict_without_the_record_decides_nothing() -> None:
    assert not _fact(FactKind.EVICT, 1, 0, 5.0).evicted


def test_refutation_by_a_higher_incarnation_survives_a_higher_lifecycle() -> None:
    """Found by hypothesis: a JOIN record at incarnation 1 refutes a suspicion at 0, then a
    SERVING record at incarnation 0 wins the record order. Refutation must follow the highest
    incarnation ever seen, or the suspicion's fate depends on delivery order."""
    items = [_record(0, 0, 0, "a"), _fact(FactKind.SUSPECT, 0, 0, 5.0), _record(0, 1, 0, "a"),
             _record(1, 0, 0, "a")]
    first = reduce(merge, items)
    assert not first.suspected and first.refuted_below == 1
    for order in ([3, 1, 2, 0], [1, 3, 0, 2], [2, 3, 1, 0]):
        assert reduce(merge, [items[i] for i in order]) == first
