"""The prefix-cache sketch travels signed in the record, bounded; over-full ones are ignored."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.cache_sketch import (
    MAX_SKETCH_BYTES,
    SKETCH_BYTES,
    build_sketch,
    matched_blocks,
    sketch_contains,
    sketch_fill,
    usable_sketch,
)
from llmfabric.registry.codec import RECORD_DOMAIN, encode_body, sign_record, verify_record
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import NodeMeta
from llmfabric.routing.cache_summary import ServedPrefixes
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.prefix import block_keys

KEY = NodeKey.generate()


def _signed_with(sketch: object) -> tuple[bytes, bytes]:
    owner = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    body = msgpack.unpackb(encode_body(owner.record), raw=False)
    body["m"]["prefix_cache"] = sketch
    raw = bytes(msgpack.packb(body, use_bin_type=True))
    return raw, KEY.sign(RECORD_DOMAIN + raw)


@given(st.sets(st.integers(0, 2**64 - 1), min_size=1, max_size=300))
def test_no_false_negatives(keys: set[int]) -> None:
    sk = build_sketch(keys)
    assert len(sk) == SKETCH_BYTES
    assert all(sketch_contains(sk, k) for k in keys)


def test_matched_blocks_stops_at_the_first_miss() -> None:
    keys = block_keys("x" * 256 * 6)
    sk = build_sketch(keys[:3])
    assert matched_blocks(sk, keys) == 3
    assert matched_blocks(b"", keys) == 0


def test_round_trip_and_absent_when_empty() -> None:
    sk = build_sketch(range(1, 100))
    owner = RecordOwner(KEY, NodeMeta(provider_id="p", prefix_cache=sk), wall=0.0)
    signed = sign_record(KEY, owner.record)
    assert verify_record(signed.body, signed.signature).record.meta.prefix_cache == sk
    bare = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    assert "prefix_cache" not in msgpack.unpackb(encode_body(bare.record), raw=False)["m"]


@pytest.mark.parametrize("value", [b"\x00" * (MAX_SKETCH_BYTES * 2), b"\x00" * 300, "abc", 7])
def test_oversized_or_malformed_sketches_are_refused_even_when_signed(value: object) -> None:
    with pytest.raises(InvalidRecord) as exc:
        verify_record(*_signed_with(value))
    assert exc.value.reason == "schema"


def test_a_sketch_claiming_everything_is_not_routed_by() -> None:
    full = b"\xff" * SKETCH_BYTES
    meta = verify_record(*_signed_with(full)).record.meta
    assert meta.prefix_cache == full  # stored as signed (forwarded byte for byte)
    assert usable_sketch(full) == b"" and sketch_fill(full) == 1.0
    from llmfabric.registry.records import NodeRecord, ServedModel
    rec = NodeRecord("s", "p", b"", 1, 0, 1, 0.0, NodeMeta(prefix_cache=full))  # type: ignore[arg-type]
    assert Candidate.from_record(rec, ServedModel("m")).prefix_cache == b""


def test_served_prefixes_is_bounded_and_rate_limited() -> None:
    served = ServedPrefixes(capacity=50, interval_s=10.0)
    assert not served.due(0.0)  # nothing served: nothing to publish (idle costs no traffic)
    served.observe(range(200))
    assert len(served) == 50
    assert served.due(0.0)
    sk = served.published(0.0)
    assert all(sketch_contains(sk, k) for k in range(150, 200))
    served.observe(range(300, 320))
    assert not served.due(5.0)  # within the interval
    assert served.due(10.0)
    served.published(10.0)
    served.observe(range(300, 320))  # nothing new
    assert not served.due(30.0)
