"""Replicas that adopt one frozen base (the scale simulation's storage) behave like replicas
that applied every item themselves, and never see each other's changes."""

from __future__ import annotations

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.cow import CowDict
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import GcConfig, Replica, item_parts
from llmfabric.registry.views import ModelRegistry
from llmfabric.testing.fake_clock import FakeClock


def _fleet(clock: FakeClock, n: int) -> list[RecordOwner]:
    out = []
    for i in range(n):
        o = RecordOwner(
            NodeKey.generate(), NodeMeta(models=(ServedModel(f"m{i % 2}"),)), wall=clock.wall()
        )
        o.set_state(Lifecycle.SERVING, wall=clock.wall())
        out.append(o)
    return out


def _state(r: Replica) -> tuple[object, ...]:
    return (
        dict(r.entries),
        r.root(),
        r.bucket_hashes(),
        r.live_peers(),
        r.digests_in(range(r.nbuckets)),
        ModelRegistry(r).models(),
    )


async def test_adopted_replicas_match_full_ones_and_do_not_leak() -> None:
    clock = FakeClock()
    owners = _fleet(clock, 12)
    src = Replica(clock, buckets=4)
    for o in owners:
        src.apply(o.current)
    base = src.freeze()
    a, b, full = Replica(clock, buckets=4), Replica(clock, buckets=4), Replica(clock, buckets=4)
    a.adopt(base)
    b.adopt(base)
    for o in owners:
        full.apply(o.current)
    assert _state(a) == _state(b) == _state(full) == _state(src)
    assert isinstance(a.entries, CowDict) and a.entries.delta_size() == 0
    # a sees one owner leave and a new one join; b and the base see nothing of it
    gone, new = owners[3], _fleet(clock, 1)[0]
    left = gone.set_state(Lifecycle.LEFT, wall=clock.wall())
    for r in (a, full):
        assert r.ingest(*item_parts(left)) is not None
        assert r.ingest(*item_parts(new.current)) is not None
    assert _state(a) == _state(full) and a.live_peers() == 12
    assert (
        _state(b) == _state(src)
        and b.live_peers() == 12
        and dict(base.entries) == dict(src.entries)
    )
    assert b.ingest(*item_parts(left)) is not None  # b still takes the same change itself
    assert b.entries[gone.session_id] == a.entries[gone.session_id]
    # GC compacts the LEFT entry past retention on the adopted replica, as on the full one
    await clock.advance(GcConfig().retention_s + 10)
    assert a.collect() == full.collect() == 1
    assert _state(a) == _state(full) and gone.session_id in a.tombstones
    assert gone.session_id in src.entries  # the base still holds it
    assert a.entries.delta_size() <= 3  # O(own changes)
