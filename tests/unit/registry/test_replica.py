"""Replica ingestion (signatures, forgeries), views and GC."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import RECORD_DOMAIN, encode_body, sign_record
from llmfabric.registry.errors import InvalidRecord, NotOwner
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.guard import TrustConfig
from llmfabric.registry.owner import LifecycleError, RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import ITEM_FACT, ITEM_RECORD, GcConfig, Replica, item_parts
from llmfabric.registry.signing import new_session_id
from llmfabric.registry.views import ModelRegistry, NodeRegistry
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.members import joined

OWNER, OTHER, THIRD = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
META = NodeMeta(provider_id="p1", models=(ServedModel("llama", aliases=("l3",)),))
ONE = TrustConfig(eviction_quorum=1)  # one EVICT evicts (as in a 2-node fleet)


def _owner(clock: FakeClock, key: NodeKey = OWNER) -> RecordOwner:
    return RecordOwner(key, META, wall=clock.wall())


def test_valid_record_enters_and_views_answer() -> None:
    clock = FakeClock()
    rep = Replica(clock)
    own = _owner(clock)
    assert rep.ingest(*item_parts(own.set_state(Lifecycle.SERVING, wall=clock.wall())))
    nodes, models = NodeRegistry(rep), ModelRegistry(rep)
    assert [v.session_id for v in nodes.routable()] == [own.session_id]
    assert [v.session_id for v in models.sessions("l3")] == [own.session_id]
    assert models.models() == {"llama": [own.session_id]}
    # suspicion removes it from routing at once, refutation brings it back; a fact by a key
    # that never joined is refused
    f = make_fact(OTHER, FactKind.SUSPECT, own.session_id, 0, clock.wall())
    assert rep.ingest(ITEM_FACT, f.body, f.signature) is None
    assert rep.rejected["unknown_author"] == 1 and len(nodes.routable()) == 1
    joined(rep, clock.wall(), OTHER)
    rep.ingest(ITEM_FACT, f.body, f.signature)
    view = nodes.get(own.session_id)
    assert nodes.routable() == [] and view is not None and view.suspected
    rep.ingest(*item_parts(own.refute(0, wall=clock.wall())))
    assert len(nodes.routable()) == 1


def test_bad_signature_never_enters() -> None:
    clock = FakeClock()
    rep = Replica(clock)
    sr = _owner(clock).current
    with pytest.raises(InvalidRecord) as exc:
        rep.ingest(ITEM_RECORD, sr.body, bytes(64))
    assert exc.value.reason == "signature" and not rep.entries


def test_record_whose_peer_id_does_not_match_key_never_enters() -> None:
    clock = FakeClock()
    rep = Replica(clock)
    rec = dataclasses.replace(_owner(clock).record, peer_id=OTHER.peer_id)
    body = encode_body(rec)
    sig = OWNER.sign(RECORD_DOMAIN + body)  # validly signed, but claims another peer id
    with pytest.raises(InvalidRecord) as exc:
        rep.ingest(ITEM_RECORD, body, sig)
    assert exc.value.reason == "peer_id" and not rep.entries


def test_record_for_a_session_of_another_key_never_enters() -> None:
    clock = FakeClock()
    rep = Replica(clock)
    victim = _owner(clock)
    # OTHER writes a LEFT record under the victim's session id with its own key
    rec = dataclasses.replace(victim.record, peer_id=OTHER.peer_id,
                              public_key=OTHER.public_bytes, state=Lifecycle.LEFT)
    with pytest.raises(NotOwner):
        sign_record(OTHER, rec)
    body = encode_body(rec)
    with pytest.raises(InvalidRecord) as exc:
        rep.ingest(ITEM_RECORD, body, OTHER.sign(RECORD_DOMAIN + body))
    assert exc.value.reason == "session" and not rep.entries


def test_fact_by_a_non_author_never_enters() -> None:
    clock = FakeClock()
    rep = Replica(clock)
    own = _owner(clock)
    rep.apply(own.current)
    f = make_fact(OTHER, FactKind.EVICT, own.session_id, 0, clock.wall())
    # THIRD re-signs OTHER's fact body: the author named inside is not the signer
    with pytest.raises(InvalidRecord):
        rep.ingest(ITEM_FACT, f.body, THIRD.sign(b"llmfabric/fact/v1\x00" + f.body))
    assert rep.entries[own.session_id].state is Lifecycle.JOIN


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=80), st.sampled_from([1, 2]))
def test_random_bytes_never_enter(body: bytes, sig: bytes, kind: int) -> None:
    rep = Replica(FakeClock())
    with contextlib.suppress(InvalidRecord):
        rep.ingest(kind, body, sig)
    assert not rep.entries


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 400), st.integers(0, 7))
def test_bit_flipped_record_never_enters(pos: int, bit: int) -> None:
    clock = FakeClock()
    rep = Replica(clock)
    sr = _owner(clock).current
    body = bytearray(sr.body)
    body[pos % len(body)] ^= 1 << bit
    with contextlib.suppress(InvalidRecord):
        rep.ingest(ITEM_RECORD, bytes(body), sr.signature)
    assert not rep.entries


def test_lifecycle_only_moves_forward_for_the_owner() -> None:
    clock = FakeClock()
    own = _owner(clock)
    own.set_state(Lifecycle.DOWN, wall=clock.wall())
    with pytest.raises(LifecycleError):
        own.set_state(Lifecycle.SERVING, wall=clock.wall())


async def test_gc_compacts_then_drops_and_never_resurrects() -> None:
    clock = FakeClock()
    gc = GcConfig(retention_s=100.0, tombstone_ttl_s=100.0, max_record_age_s=150.0,
                  refresh_interval_s=10.0)
    rep = Replica(clock, gc)
    own = _owner(clock)
    serving = own.set_state(Lifecycle.SERVING, wall=clock.wall())
    rep.apply(serving)
    await clock.advance(10)
    left = own.set_state(Lifecycle.LEFT, wall=clock.wall())
    rep.apply(left)
    sid = own.session_id
    assert NodeRegistry(rep).get(sid) is not None and rep.digest(sid) is not None
    await clock.advance(101)
    rep.collect()
    assert sid not in rep.entries and sid in rep.tombstones and rep.digest(sid) is None
    # a late delta (the old SERVING record, even a fresh eviction fact) cannot bring it back
    assert rep.apply(serving) is None and sid not in rep.entries
    assert rep.apply(make_fact(OTHER, FactKind.SUSPECT, sid, 5, clock.wall())) is None
    await clock.advance(100)
    rep.collect()
    assert sid not in rep.tombstones
    # after the tombstone is gone, the age gate refuses anything from that session's life
    assert rep.apply(serving) is None and rep.apply(left) is None
    assert sid not in rep.entries and rep.rejected["stale"] >= 2


def test_gc_config_guards_the_resurrection_bound() -> None:
    with pytest.raises(Exception, match="max_record_age_s"):
        GcConfig(retention_s=10, tombstone_ttl_s=10, max_record_age_s=30)


def test_session_ids_are_bound_to_keys() -> None:
    a = new_session_id(OWNER.public_bytes)
    assert a != new_session_id(OWNER.public_bytes)
    assert a[16:] == new_session_id(OWNER.public_bytes)[16:]
    assert a[16:] != new_session_id(OTHER.public_bytes)[16:]


def test_views_report_the_effective_state_of_an_evicted_session() -> None:
    clock = FakeClock()
    rep = Replica(clock, trust=ONE)
    own = _owner(clock)
    rep.apply(own.set_state(Lifecycle.SERVING, wall=clock.wall()))
    joined(rep, clock.wall(), OTHER)
    rep.apply(make_fact(OTHER, FactKind.EVICT, own.session_id, 0, clock.wall()))
    v = NodeRegistry(rep).get(own.session_id)
    assert v is not None and v.state is Lifecycle.LEFT and v.record.state is Lifecycle.LEFT
    assert NodeRegistry(rep).routable() == [] and ModelRegistry(rep).sessions("llama") == []


async def test_a_fact_that_changed_nothing_is_not_verified_again_but_still_merged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmfabric.registry import replica as replica_mod

    calls: list[bytes] = []
    real = replica_mod.verify_fact

    def counting(body: bytes, sig: bytes):  # type: ignore[no-untyped-def]
        calls.append(sig)
        return real(body, sig)

    monkeypatch.setattr(replica_mod, "verify_fact", counting)
    clock = FakeClock()
    rep = Replica(clock, trust=ONE)
    own = _owner(clock)
    rep.apply(own.set_state(Lifecycle.SERVING, wall=clock.wall()))
    joined(rep, clock.wall(), OTHER)
    joined(rep, clock.wall(), THIRD)
    rep.apply(own.refute(0, wall=clock.wall()))  # incarnation 1: a SUSPECT of 0 is stale
    stale = make_fact(OTHER, FactKind.SUSPECT, own.session_id, 0, clock.wall())
    for _ in range(5):  # gossip delivers it again and again
        assert rep.ingest(ITEM_FACT, stale.body, stale.signature) is None
    assert calls == [stale.signature]
    # a forged body under a remembered signature is still verified, and refused
    forged = make_fact(THIRD, FactKind.EVICT, own.session_id, 1, clock.wall()).body
    with pytest.raises(InvalidRecord):
        rep.ingest(ITEM_FACT, forged, stale.signature)
    assert not rep.entries[own.session_id].evicted
    # a fact refused for now (stamped an hour and more ahead) applies once the clock gets
    # there, without a second verify
    ahead = make_fact(OTHER, FactKind.EVICT, own.session_id, 1, clock.wall() + 7200)
    assert rep.ingest(ITEM_FACT, ahead.body, ahead.signature) is None
    assert rep.rejected["future"] == 1
    await clock.advance(7200)
    assert rep.ingest(ITEM_FACT, ahead.body, ahead.signature) is not None
    assert rep.entries[own.session_id].evicted
    assert calls.count(ahead.signature) == 1


async def test_new_record_versions_per_peer_pass_a_byte_bucket_except_our_own() -> None:
    """A peer's new versions spend its bucket (re-deliveries do not); the bucket refills at
    its rate; the replica's own records are never held back."""
    clock = FakeClock()
    trust = TrustConfig(record_bytes_per_s=4096, record_burst_bytes=16 * 1024)
    me, other = NodeKey.generate(), NodeKey.generate()
    rep = Replica(clock, trust=trust, own_peer=me.peer_id)
    mine = RecordOwner(me, NodeMeta(), wall=clock.wall())
    theirs = RecordOwner(other, NodeMeta(), wall=clock.wall())
    for _ in range(200):
        assert rep.apply(mine.set_state(Lifecycle.SERVING, wall=clock.wall())) is not None
    taken = 0
    last = theirs.set_state(Lifecycle.SERVING, wall=clock.wall())
    for _ in range(200):
        last = theirs.set_state(Lifecycle.SERVING, wall=clock.wall())
        taken += rep.apply(last) is not None
    size = len(last.body)
    assert taken == (16 * 1024) // size  # the burst, then nothing
    assert rep.rejected["record_rate_limited"] == 200 - taken
    held = rep.entries[theirs.session_id].record
    assert held is not None and rep.apply(held) is None  # a re-delivery: free
    assert rep.rejected["record_rate_limited"] == 200 - taken
    await clock.advance(size / 4096)  # one version's worth of bytes later
    assert rep.apply(last) is not None  # the newest, offered again (anti-entropy), enters
    assert rep.entries[theirs.session_id].record == last


def test_author_buckets_are_forgotten_once_refilled() -> None:
    """A simulated 10,000-node fleet runs 10,000 replicas, each hearing every author: a
    limiter holds only the authors whose bucket is still below full, not every author heard
    in the last burst / rate seconds."""
    from llmfabric.registry.guard import AuthorLimiter

    lim = AuthorLimiter(rate=32 * 1024, burst=256 * 1024)
    for i in range(3000):  # honest versions of 2 KB, spread over one second
        assert lim.allow(f"peer-{i}", i / 3000, 2048)
    assert len(lim) <= 3000 / 16 + 1  # each refilled 1/16 s after its spend
    for _ in range(200):
        lim.allow("flooder", 1.0, 13_000)
    assert not lim.allow("flooder", 1.0, 13_000)
    assert lim.allow("flooder", 1.5, 13_000)  # 16 KB refilled in half a second
    assert "flooder" in lim._buckets  # still below full: remembered
