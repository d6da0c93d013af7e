"""The KV-event decoder: vLLM's encodings decode; hostile messages raise KvEventError only."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.agent.kv_events_config import KvEventsConfigError, from_argv, parse
from llmfabric.routing.kv_events import (
    MAX_EVENTS,
    MAX_HASHES,
    MAX_PAYLOAD_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventError,
    decode_message,
    decode_payload,
)

# A batch encoded by vLLM 0.32's own encoder (msgspec, KVEventBatch): two BlockStored (32-byte
# hashes, the second a child of the first run's last block), one BlockRemoved, one
# AllBlocksCleared; data_parallel_rank None.
VLLM_0_32_BATCH = bytes.fromhex(
    "93cb41d954fc402000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "92c4200101010101010101010101010101010101010101010101010101010101010101c420020202020202"
    "0202020202020202020202020202020202020202020202020202b1706172656e745f626c6f636b5f686173"
    "68c0a9746f6b656e5f696473dc0020000102030405060708090a0b0c0d0e0f101112131415161718191a1b"
    "1c1d1e1faa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e"
    "616d65c088a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c4200303030303"
    "030303030303030303030303030303030303030303030303030303b1706172656e745f626c6f636b5f6861"
    "7368c4200202020202020202020202020202020202020202020202020202020202020202a9746f6b656e5f"
    "696473dc0010000102030405060708090a0b0c0d0e0faa626c6f636b5f73697a6510a76c6f72615f6964c0"
    "a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac62"
    "6c6f636b5f68617368657391c4200101010101010101010101010101010101010101010101010101010101"
    "010101a66d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564c0"
)


def _msg(payload: bytes, seq: int = 7, topic: bytes = b"kv") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload]


def _pack(events: list[Any], ts: float = 1.0) -> bytes:
    out = msgpack.packb([ts, events])
    assert isinstance(out, bytes)
    return out


def test_vllm_batch_decodes() -> None:
    batch = decode_message(_msg(VLLM_0_32_BATCH), b"kv")
    assert batch.seq == 7 and batch.ts == 1700000000.5 and batch.dp_rank is None
    one, two, three = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    assert batch.events == (
        BlockStored((one, two), None, 16),
        BlockStored((three,), two, 16),
        BlockRemoved((one,)),
        AllBlocksCleared(),
    )


def test_array_encoding_of_earlier_vllm_and_int_hashes() -> None:
    payload = _pack(
        [
            ["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"],
            ["BlockRemoved", [11], "GPU"],
            ["AllBlocksCleared"],
        ]
    )
    batch = decode_payload(payload, 3)
    assert batch.events == (
        BlockStored((11, 12), None, 16),
        BlockRemoved((11,)),
        AllBlocksCleared(),
    )


def test_unknown_events_and_other_tiers_are_skipped_and_counted() -> None:
    payload = _pack(
        [
            {"type": "BlockReused", "x": 1},
            {
                "type": "BlockStored",
                "block_hashes": [1],
                "parent_block_hash": None,
                "token_ids": [],
                "block_size": 16,
                "medium": "CPU",
            },
            {"type": "BlockRemoved", "block_hashes": [1], "group_idx": 1},
            {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
        ]
    )
    batch = decode_payload(payload)
    assert batch.events == (BlockRemoved((2,)),)
    assert batch.unknown == 1 and batch.skipped == 2


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", b"\0" * 8],  # two frames
        [b"kv", b"\0" * 8, b"", b""],  # four
        [b"kv", b"\0" * 7, _pack([])],  # short sequence
        [b"other", b"\0" * 8, _pack([])],  # another topic
        [b"kv" * 200, b"\0" * 8, _pack([])],  # oversized topic
    ],
)
def test_bad_framing_is_rejected(frames: list[bytes]) -> None:
    with pytest.raises(KvEventError):
        decode_message(frames, b"kv")


def _stored(**over: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [b"h" * 8],
        "parent_block_hash": None,
        "token_ids": [1] * 16,
        "block_size": 16,
    }
    ev.update(over)
    return ev


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # empty
        b"\xc1",  # a msgpack byte that is never valid
        msgpack.packb({"ts": 1, "events": []}),  # a map, not the batch array
        msgpack.packb([1.0]),  # too short
        msgpack.packb(["now", []]),  # ts not a number
        msgpack.packb([1.0, [], "rank"]),  # rank not an integer
        msgpack.packb([1.0, {"a": 1}]),  # events not an array
        msgpack.packb([1.0, [5]]),  # an event that is neither map nor tagged array
        msgpack.packb([1.0, [{"block_hashes": []}]]),  # a map without a type
        _pack([_stored(block_hashes="abc")]),
        _pack([_stored(block_hashes=[1.5])]),  # a float hash
        _pack([_stored(block_hashes=[True])]),  # a boolean is not a hash
        _pack([_stored(block_hashes=[b""])]),  # an empty hash
        _pack([_stored(block_hashes=[b"x" * 65])]),  # an oversized hash
        _pack([_stored(parent_block_hash=[1])]),
        _pack([_stored(block_size=0)]),
        _pack([_stored(block_size="16")]),
        _pack([_stored(block_size=1 << 20)]),
        _pack([_stored(token_ids=[1] * 17)]),  # more tokens than one block holds
        _pack([_stored(token_ids="abc")]),
        _pack([_stored(medium=3)]),
        _pack([_stored(group_idx="0")]),
        _pack([{"type": "BlockRemoved", "block_hashes": None}]),
        _pack(
            [_stored(block_hashes=[b"h" * 8] * (MAX_HASHES + 1), token_ids=[])]
        ),  # too many hashes in one event
        _pack([{"type": "AllBlocksCleared"}] * (MAX_EVENTS + 1)),  # too many events
        msgpack.packb([1.0, []]) + b"\x00",  # trailing data
        b"\x91" * 10_000 + b"\xc0",  # nested arrays: the unpacker's stack limit
        b"\x92\x01\xdd\x7f\xff\xff\xff",  # an array that declares 2^31 items
        b"\xd9",  # truncated
    ],
)
def test_hostile_payloads_raise_kv_event_error(payload: bytes) -> None:
    with pytest.raises(KvEventError):
        decode_payload(payload)


def test_oversized_payload_is_refused_before_unpacking() -> None:
    with pytest.raises(KvEventError, match="over"):
        decode_payload(b"\x00" * (MAX_PAYLOAD_BYTES + 1))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_raise_anything_else(payload: bytes) -> None:
    with contextlib.suppress(KvEventError):
        decode_payload(payload)


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=80),
)
_doc = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "block_hashes",
                    "parent_block_hash",
                    "token_ids",
                    "block_size",
                    "medium",
                    "group_idx",
                ]
            ),
            inner,
            max_size=7,
        ),
        st.tuples(
            st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]), inner, inner
        ).map(list),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_doc, max_size=5), st.floats(allow_nan=False))
def test_well_formed_msgpack_of_any_shape_decodes_or_raises_kv_event_error(
    events: list[Any], ts: float
) -> None:
    try:
        batch = decode_payload(_pack(events, ts))
    except KvEventError:
        return
    for ev in batch.events:
        assert isinstance(ev, (BlockStored, BlockRemoved, AllBlocksCleared))


# ---- the --kv-events-config flag ------------------------------------------------------------
def test_config_flag_endpoints() -> None:
    wild = parse('{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv"}')
    assert wild is not None and wild.publisher_binds
    assert wild.subscriber_endpoint == "tcp://127.0.0.1:5557" and wild.topic == "kv"
    local = parse(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000"}'
    )
    assert local is not None and not local.publisher_binds
    assert local.subscriber_endpoint == "tcp://127.0.0.1:6000"
    default = parse('{"enable_kv_cache_events": true}')
    assert default is not None and default.subscriber_endpoint == "tcp://127.0.0.1:5557"
    assert parse('{"enable_kv_cache_events": false}') is None
    assert parse('{"enable_kv_cache_events": true, "publisher": "null"}') is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"enable_kv_cache_events": "yes"}',
        '{"enable_kv_cache_events": true, "endpoint": 5}',
        '{"enable_kv_cache_events": true, "endpoint": "http://x:1"}',
        '{"enable_kv_cache_events": true, "endpoint": "tcp://x"}',
        "{" + " " * 5000 + "}",
    ],
)
def test_config_flag_errors(text: str) -> None:
    with pytest.raises(KvEventsConfigError):
        parse(text)


def test_config_flag_in_an_engine_command() -> None:
    flag = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:7000"}'
    for argv in (
        ["vllm", "serve", "m", "--kv-events-config", flag],
        ["vllm", "serve", "m", f"--kv-events-config={flag}"],
    ):
        found = from_argv(argv)
        assert found is not None and found.endpoint == "tcp://127.0.0.1:7000"
    assert from_argv(["vllm", "serve", "m"]) is None


def test_a_batch_of_too_many_hashes_is_refused_whole() -> None:
    """Every event within its own bound, but 200 of them of 4,096 hashes each (819k hashes in
    3.9 MiB) blocked the node's event loop for 1.4 s while they were applied."""
    from llmfabric.routing.kv_events import MAX_BATCH_HASHES

    def removed(n: int, start: int) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": list(range(start, start + n))}

    per = MAX_HASHES
    fits = [removed(per, i * per) for i in range(MAX_BATCH_HASHES // per)]
    assert len(decode_payload(_pack(fits)).events) == len(fits)
    with pytest.raises(KvEventError, match="block hashes in one batch"):
        decode_payload(_pack([*fits, removed(1, 10**9)]))
