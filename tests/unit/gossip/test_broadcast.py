"""The transmit-limited queue: limits, replacement, byte budget, duplicate feedback."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.gossip.broadcast import BroadcastQueue
from llmfabric.gossip.wire import ITEM_OVERHEAD


def _item(tag: bytes, size: int = 10) -> tuple[int, bytes, bytes]:
    return (1, b"x" * size, tag)


def test_each_item_is_sent_at_most_limit_times() -> None:
    q = BroadcastQueue()
    q.push("a", _item(b"a"))
    sends = [q.take(1000, limit=3) for _ in range(5)]
    assert [len(s) for s in sends] == [1, 1, 1, 0, 0] and len(q) == 0


def test_newer_item_replaces_older_and_own_limit_caps() -> None:
    q = BroadcastQueue()
    q.push("a", _item(b"old"))
    q.push("a", _item(b"new"), limit=1)
    assert q.take(1000, limit=5) == [_item(b"new")]
    assert q.take(1000, limit=5) == []


def test_budget_packs_least_sent_first() -> None:
    q = BroadcastQueue()
    q.push("a", _item(b"a", 50))
    assert q.take(1000, limit=9) == [_item(b"a", 50)]
    q.push("b", _item(b"b", 50))
    # room for one item only: the never-sent one goes first
    assert q.take(70, limit=9) == [_item(b"b", 50)]


def test_duplicates_heard_use_up_the_budget() -> None:
    q = BroadcastQueue()
    q.push("a", _item(b"sig"))
    q.heard_again("a", b"other-sig")  # a different version: no effect
    q.heard_again("a", b"sig")
    q.heard_again("a", b"sig")
    assert len(q.take(1000, limit=3)) == 1
    assert q.take(1000, limit=3) == [] and len(q) == 0


def test_the_queue_is_bounded_whatever_keys_an_attacker_picks() -> None:
    q = BroadcastQueue(max_items=16)
    for i in range(1000):
        q.push(("f", i.to_bytes(8, "big")), (2, b"x", i.to_bytes(8, "big")))
    assert len(q) == 16 and q.dropped == 1000 - 16
    # the newest survive (all unsent: the oldest go first)
    assert {it[2] for it in q.take(10**6, 3)} == {i.to_bytes(8, "big") for i in range(984, 1000)}


class Reference:
    """The queue's specification, written plainly: every take sorts every item."""

    def __init__(self, max_items: int) -> None:
        self.items: dict[object, tuple[int, int, tuple[int, bytes, bytes], int]] = {}
        self.seq = 0
        self.max_items = max_items
        self.dropped = 0

    def push(self, key: object, item: tuple[int, bytes, bytes], limit: int) -> None:
        self.seq += 1
        self.items[key] = (0, self.seq, item, limit)
        if len(self.items) > self.max_items:
            victim = max(self.items, key=lambda k: (self.items[k][0], -self.items[k][1]))
            del self.items[victim]
            self.dropped += 1

    def take(self, budget: int, limit: int) -> list[tuple[int, bytes, bytes]]:
        out, used = [], 0
        for key, (sent, seq, item, own) in sorted(self.items.items(),
                                                  key=lambda kv: (kv[1][0], -kv[1][1])):
            cap = min(own, limit) if own else limit
            if sent >= cap:
                del self.items[key]
                continue
            size = len(item[1]) + len(item[2]) + ITEM_OVERHEAD
            if used + size > budget:
                continue
            used += size
            out.append(item)
            if sent + 1 >= cap:
                del self.items[key]
            else:
                self.items[key] = (sent + 1, seq, item, own)
        return out

    def heard_again(self, key: object, sig: bytes) -> None:
        cur = self.items.get(key)
        if cur is not None and cur[2][2] == sig:
            self.items[key] = (cur[0] + 1, *cur[1:])


def _ops(heard: bool) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    kinds = [
        st.tuples(st.just("push"), st.integers(0, 9), st.integers(1, 60), st.integers(0, 3)),
        st.tuples(st.just("take"), st.integers(0, 200), st.integers(1, 5)),
    ]
    if heard:
        kinds.append(st.tuples(st.just("heard"), st.integers(0, 9), st.booleans()))
    return st.lists(st.one_of(kinds), max_size=80)


def _replay(plan: list[tuple[Any, ...]], q: BroadcastQueue, ref: Reference,
            fixed_limit: int | None) -> None:
    tags: dict[int, bytes] = {}
    for n, op in enumerate(plan):
        if op[0] == "push":
            _, key, size, own = op
            tags[key] = n.to_bytes(2, "big")
            item = (1, b"x" * size, tags[key])
            q.push(key, item, own)
            ref.push(key, item, own)
        elif op[0] == "take":
            limit = fixed_limit or op[2]
            assert q.take(op[1], limit) == ref.take(op[1], limit)
        else:
            sig = tags.get(op[1], b"?") if op[2] else b"other"
            q.heard_again(op[1], sig)
            ref.heard_again(op[1], sig)
        assert len(q) == len(ref.items) and q.dropped == ref.dropped


@settings(max_examples=300, deadline=None)
@given(_ops(heard=True))
def test_a_short_queue_is_the_specification(plan: list[tuple[Any, ...]]) -> None:
    """Law: a queue short enough to be sorted on each take sends, keeps and drops exactly
    what the specification does, with any limits and duplicates heard."""
    _replay(plan, BroadcastQueue(max_items=6), Reference(6), None)


@settings(max_examples=300, deadline=None)
@given(_ops(heard=False), st.integers(1, 5), st.sampled_from([0, 2, 4]))
def test_the_heaps_give_what_sorting_every_item_gives(plan: list[tuple[Any, ...]],
                                                      limit: int, heap_above: int) -> None:
    """Law: with one limit and no duplicates heard (nothing used up waits in the heaps),
    the heaps send, keep and drop exactly what the specification does, across the switches
    between sorting and heaps."""
    _replay(plan, BroadcastQueue(max_items=6, heap_above=heap_above), Reference(6), limit)


@settings(max_examples=300, deadline=None)
@given(_ops(heard=True))
def test_the_heaps_never_send_past_the_limit_or_the_budget(plan: list[tuple[Any, ...]]
                                                           ) -> None:
    """Law: in heaps, with duplicates heard and limits changing, a take fits its budget,
    gives each item once, and no version is sent or heard more often than the highest
    limit it was sent under; the queue stays within `max_items`."""
    q = BroadcastQueue(max_items=6, heap_above=0)
    count: dict[bytes, int] = {}
    tags: dict[int, bytes] = {}
    for n, op in enumerate(plan):
        if op[0] == "push":
            _, key, size, own = op
            tags[key] = n.to_bytes(2, "big")
            q.push(key, (1, b"x" * size, tags[key]), own)
        elif op[0] == "take":
            out = q.take(op[1], op[2])
            assert sum(len(b) + len(s) + ITEM_OVERHEAD for _, b, s in out) <= op[1]
            assert len({s for _, _, s in out}) == len(out)
            for _, _, sig in out:
                count[sig] = count.get(sig, 0) + 1
                assert count[sig] <= op[2]
        elif op[1] in tags and op[2]:
            q.heard_again(op[1], tags[op[1]])
            count[tags[op[1]]] = count.get(tags[op[1]], 0) + 1
        assert len(q) <= 6


def test_a_full_queue_is_taken_from_in_bounded_steps() -> None:
    """4,096 queued rumours of which none fits the budget: a take gives up after `max_skips`
    of them instead of looking at all; the ones it looked at stay queued, unsent."""
    q = BroadcastQueue(max_items=4096, max_skips=32)
    for i in range(4096):
        q.push(i, _item(i.to_bytes(4, "big"), size=500))
    assert q.take(100, limit=5) == []
    assert len(q) == 4096 and len(q._next) == 4096  # nothing lost, nothing filed twice
    assert len(q.take(10**7, limit=5)) == 4096
