"""Wire codec: round trips, and garbage of every kind is rejected with a reason (hypothesis)."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.gossip.wire import (
    VERSION,
    Ack,
    Gossip,
    MsgKind,
    Ping,
    PingReq,
    SyncBuckets,
    SyncDeltas,
    SyncDigest,
    SyncRoot,
    WireError,
    decode,
    encode,
)

items = st.lists(st.tuples(st.integers(1, 2), st.binary(max_size=40), st.binary(max_size=64)),
                 max_size=3).map(tuple)
sids = st.text(max_size=40)
messages = st.one_of(
    st.builds(Ping, st.integers(0, 2**62), sids, items),
    st.builds(Ack, st.integers(0, 2**62), items),
    st.builds(PingReq, st.integers(0, 2**62), sids, sids),
    st.builds(Gossip, items),
    st.builds(SyncRoot, st.integers(0, 2**63), st.integers(0, 10**6)),
    st.builds(SyncBuckets, st.lists(st.integers(0, 2**64 - 1), max_size=32).map(tuple)),
    st.builds(SyncDigest, st.lists(st.integers(0, 255), max_size=4).map(tuple),
              st.lists(st.tuples(sids, st.binary(min_size=8, max_size=8)),
                       max_size=4).map(tuple)),
    st.builds(SyncDeltas, items, st.lists(sids, max_size=3).map(tuple)),
)


@settings(max_examples=300, deadline=None)
@given(messages, sids)
def test_round_trip(msg: object, sender: str) -> None:
    assert decode(encode(msg, sender)) == (sender, msg)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_wire_error_only(data: bytes) -> None:
    try:
        decode(data)
    except WireError as exc:
        assert exc.reason in {"garbled", "version", "kind", "schema", "oversized"}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**62), st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=5) | st.binary(max_size=5),
    lambda c: st.lists(c, max_size=4), max_leaves=10))
def test_well_formed_envelopes_with_wrong_bodies_raise_schema(kind_seed: int, body: object) -> None:
    kind = list(MsgKind)[kind_seed % len(MsgKind)]
    data = msgpack.packb([VERSION, int(kind), "s", body], use_bin_type=True)
    try:
        decode(data)
    except WireError as exc:
        assert exc.reason == "schema"


@settings(max_examples=200, deadline=None)
@given(messages, st.data())
def test_truncated_or_flipped_messages_never_crash(msg: object, data: st.DataObject) -> None:
    raw = bytearray(encode(msg, "x"))  # type: ignore[arg-type]
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    for blob in (bytes(raw), bytes(raw[:pos])):
        with contextlib.suppress(WireError):
            decode(blob)


def test_specific_reasons() -> None:
    good = encode(SyncRoot(1, 2), "s")
    assert decode(good) == ("s", SyncRoot(1, 2))
    cases = {
        "oversized": b"\x00" * 70_000,
        "garbled": b"\xc1\xc1",
        "version": msgpack.packb([99, 5, "s", [1, 2]]),
        "kind": msgpack.packb([VERSION, 999, "s", []]),
        "schema": msgpack.packb([VERSION, int(MsgKind.SYNC_ROOT), "s", [-1, 2]]),
    }
    for reason, blob in cases.items():
        with pytest.raises(WireError) as exc:
            decode(blob)
        assert exc.value.reason == reason
