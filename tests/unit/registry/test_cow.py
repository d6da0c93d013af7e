"""Copy-on-write containers: the same observable behaviour as a dict / set, and a copy's writes
never reach the base or another copy over the same base (what the scale simulation relies on)."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.registry.cow import CowDict, CowSet

KEYS = st.integers(0, 12)
# (op, key, value): set / delete / pop; applied to a dict and to a CowDict side by side
OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "pop"]), KEYS, st.integers()), max_size=40)


def _apply(d: dict[int, int] | CowDict[int, int], op: str, k: int, v: int) -> object:
    try:
        if op == "set":
            d[k] = v
            return None
        if op == "del":
            del d[k]
            return None
        return d.pop(k, None)
    except KeyError:
        return KeyError


def _same(a: dict[int, int], b: CowDict[int, int]) -> None:
    assert len(b) == len(a)
    assert dict(b.items()) == a and set(b) == set(a)
    for k in range(-1, 14):
        assert (k in b) == (k in a)
        assert b.get(k, "none") == a.get(k, "none")
        if k in a:
            assert b[k] == a[k]
        else:
            with pytest.raises(KeyError):
                b[k]


@settings(max_examples=300, deadline=None)
@given(base=st.dictionaries(KEYS, st.integers(), max_size=10), ops=OPS, other_ops=OPS)
def test_cowdict_behaves_like_a_dict_and_never_leaks(
    base: dict[int, int], ops: list[tuple[str, int, int]], other_ops: list[tuple[str, int, int]]
) -> None:
    frozen = MappingProxyType(dict(base))
    mine, theirs = CowDict(frozen), CowDict(frozen)
    ref_mine, ref_theirs = dict(base), dict(base)
    for (op, k, v), (op2, k2, v2) in zip(
        ops, other_ops + [("pop", 99, 0)] * len(ops), strict=False
    ):
        assert _apply(mine, op, k, v) == _apply(ref_mine, op, k, v)
        assert _apply(theirs, op2, k2, v2) == _apply(ref_theirs, op2, k2, v2)
    _same(ref_mine, mine)
    _same(ref_theirs, theirs)  # the other copy saw none of our writes (nor we of its)
    assert dict(frozen) == base  # the shared base is untouched
    assert mine.delta_size() <= len(ops)  # memory: O(own writes), not O(base)


def test_cowdict_iterates_base_order_then_new_keys() -> None:
    d = CowDict(MappingProxyType({1: "a", 2: "b", 3: "c"}))
    d[4] = "d"
    d[2] = "B"
    del d[1]
    assert list(d) == [3, 4, 2] and list(d.values()) == ["c", "d", "B"]


@settings(max_examples=300, deadline=None)
@given(
    base=st.frozensets(KEYS, max_size=10),
    ops=st.lists(st.tuples(st.booleans(), KEYS), max_size=40),
    other=st.lists(st.tuples(st.booleans(), KEYS), max_size=40),
)
def test_cowset_behaves_like_a_set_and_never_leaks(
    base: frozenset[int], ops: list[tuple[bool, int]], other: list[tuple[bool, int]]
) -> None:
    mine, theirs = CowSet(base), CowSet(base)
    ref_mine, ref_theirs = set(base), set(base)
    for s, ref, seq in ((mine, ref_mine, ops), (theirs, ref_theirs, other)):
        for add, k in seq:
            if add:
                s.add(k)
                ref.add(k)
            else:
                s.discard(k)
                ref.discard(k)
    for s, ref in ((mine, ref_mine), (theirs, ref_theirs)):
        assert len(s) == len(ref) and set(s) == ref and sorted(s) == sorted(ref)
        assert all((k in s) == (k in ref) for k in range(-1, 14))
    assert mine.delta_size() <= len(ops)
