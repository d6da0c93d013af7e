"""The transmit-limited queue: limits, replacement, byte budget, duplicate feedback."""

from __future__ import annotations

from llmfabric.gossip.broadcast import BroadcastQueue


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
