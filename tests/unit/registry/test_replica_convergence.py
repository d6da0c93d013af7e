"""Replicas fed the same items in any order, with duplicates, end in the same state (roots)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import Replica, item_parts
from llmfabric.testing.fake_clock import FakeClock

KEYS = [NodeKey.generate() for _ in range(3)]
MEMBERS = [RecordOwner(k, NodeMeta(), wall=1_700_000_000.0).current for k in KEYS]


def _history(ops: list[tuple[int, int, int]]) -> list[tuple[int, bytes, bytes]]:
    """Items produced by 2 owners and 3 fact authors following `ops`."""
    wall = 1_700_000_000.0
    owners = [RecordOwner(KEYS[i], NodeMeta(provider_id=f"p{i}"), wall=wall) for i in range(2)]
    items = [item_parts(o.current) for o in owners]
    for op, who, arg in ops:
        o = owners[who % 2]
        if op == 0:
            items.append(item_parts(o.update_meta(NodeMeta(provider_id=f"v{arg}"), wall=wall)))
        elif op == 1 and o.record.state < Lifecycle.LEFT:
            state = Lifecycle(min(3, int(o.record.state) + 1))
            items.append(item_parts(o.set_state(state, wall=wall)))
        elif op == 2:
            items.append(item_parts(make_fact(KEYS[arg % 3], FactKind.SUSPECT, o.session_id,
                                              o.record.incarnation, wall)))
        elif op == 3:
            items.append(item_parts(o.refute(o.record.incarnation, wall=wall)))
        elif op == 4 and arg % 5 == 0:
            items.append(item_parts(make_fact(KEYS[arg % 3], FactKind.EVICT, o.session_id,
                                              o.record.incarnation, wall)))
    return items


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1), st.integers(0, 9)),
                max_size=12), st.integers(0, 2**32))
def test_replicas_converge_whatever_the_order(ops: list[tuple[int, int, int]], seed: int) -> None:
    items = _history(ops)
    rnd = random.Random(seed)
    shuffled = items + rnd.sample(items, k=min(len(items), 5))  # plus duplicates
    rnd.shuffle(shuffled)
    a, b = Replica(FakeClock()), Replica(FakeClock())
    for rep in (a, b):  # every author is a member first (facts by strangers are refused)
        for rec in MEMBERS:
            rep.apply(rec)
    for it in items:
        a.ingest(*it)
    # Items refused for now (a fact ahead of the record it is about) come again through
    # anti-entropy: deliver the shuffled stream twice.
    for it in shuffled + shuffled:
        b.ingest(*it)
    assert a.entries == b.entries
    assert a.root() == b.root() and a.bucket_hashes() == b.bucket_hashes()
