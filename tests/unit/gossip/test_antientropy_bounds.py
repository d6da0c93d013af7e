"""Anti-entropy answers only within a round, each bucket and wanted session once a round, and a
bounded number of rounds per peer: a member cannot make a node send the registry over and
over for a few bytes (a 74-byte digest pulled everything; one id repeated 1,700 times in
`want` pulled 26 MB for 58 KB)."""

from __future__ import annotations

import pytest

from llmfabric.gossip.antientropy import AntiEntropy
from llmfabric.gossip.wire import Message, SyncBuckets, SyncDeltas, SyncDigest, SyncRoot
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import Replica, item_parts
from llmfabric.testing.fake_clock import FakeClock

pytestmark = [pytest.mark.unit, pytest.mark.hostile]


def _node(n: int) -> tuple[FakeClock, Replica, AntiEntropy, list[tuple[str, Message]]]:
    clock = FakeClock()
    rep = Replica(clock)
    for _ in range(n):
        own = RecordOwner(NodeKey.generate(), NodeMeta(), wall=clock.wall())
        assert rep.ingest(*item_parts(own.set_state(Lifecycle.SERVING, wall=clock.wall())))
    sent: list[tuple[str, Message]] = []
    ae = AntiEntropy(rep, lambda peer, msg: sent.append((peer, msg)), 60_000, now=clock.now,
                     round_timeout_s=30.0, round_interval_s=2.0, rounds_burst=4.0)
    return clock, rep, ae, sent


def _items(sent: list[tuple[str, Message]]) -> int:
    return sum(len(m.items) for _, m in sent if isinstance(m, SyncDeltas))


def test_steps_nobody_asked_for_are_not_answered() -> None:
    _, rep, ae, sent = _node(20)
    every = tuple(range(rep.nbuckets))
    ae.on_digest("mallory", SyncDigest(every, ()))  # would pull the whole registry
    ae.on_buckets("mallory", SyncBuckets((0,)))  # the wrong length: every digest
    ae.on_deltas("mallory", SyncDeltas((), (next(iter(rep.entries)),) * 1700))
    assert sent == []
    assert ae.refused == {"unasked_digest": 1, "unasked_buckets": 1, "unasked_want": 1}


def test_within_a_round_each_bucket_and_session_is_answered_once() -> None:
    _, rep, ae, sent = _node(20)
    ae.on_root("peer", SyncRoot(0, 0))  # a round: our buckets go out
    assert [type(m) for _, m in sent] == [SyncBuckets]
    every = tuple(range(rep.nbuckets))
    for _ in range(3):  # the same digest again and again
        ae.on_digest("peer", SyncDigest(every, ()))
    assert _items(sent) == 20  # each record once
    # our own round: a want of one id 1,700 times is answered with one copy, once
    sent.clear()
    ae.start("peer")
    ae.on_buckets("peer", SyncBuckets((0,) * rep.nbuckets))
    sid = next(iter(rep.entries))
    for _ in range(2):
        ae.on_deltas("peer", SyncDeltas((), (sid,) * 1700))
    assert _items(sent) == 1


async def test_rounds_a_peer_starts_are_rate_limited() -> None:
    clock, _, ae, sent = _node(5)
    for _ in range(10):
        ae.on_root("peer", SyncRoot(0, 0))
    assert sum(isinstance(m, SyncBuckets) for _, m in sent) == 4  # the burst
    assert ae.refused["rate_limited"] == 6
    ae.on_root("other", SyncRoot(0, 0))  # another peer is not held back
    assert sum(isinstance(m, SyncBuckets) for p, m in sent if p == "other") == 1
    await clock.advance(2.0)  # one more round a sync interval later
    ae.on_root("peer", SyncRoot(0, 0))
    assert sum(isinstance(m, SyncBuckets) for p, m in sent if p == "peer") == 5


async def test_round_state_is_held_only_as_long_as_it_matters() -> None:
    """What a node remembers of rounds (and of each peer's round budget) is bounded by the
    last timeout, not by how many peers ever synced with it (10,000 at scale)."""
    clock, _, ae, _ = _node(3)
    for i in range(200):
        ae.on_root(f"peer{i}", SyncRoot(0, 0))
        ae.start(f"peer{i}")
        await clock.advance(1.0)
    assert len(ae._bucketed._open) <= 31 and len(ae._started._open) <= 31
    assert len(ae._rounds_in) <= 9  # full buckets (burst 4 / 0.5 per s = 8 s) are dropped
