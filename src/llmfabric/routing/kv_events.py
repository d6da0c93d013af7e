"""Decoding an engine's KV-cache events (vLLM's `--kv-events-config` ZMQ publisher format).

One ZMQ message is three frames: the topic, an 8-byte big-endian sequence number, and a
msgpack payload: the batch `[ts, events]` or `[ts, events, data_parallel_rank]`. Each event
is tagged by its type name, either as a map (`{"type": "BlockStored", "block_hashes": ...}`,
vLLM's current encoding) or as an array whose first item is the tag (`["BlockStored",
block_hashes, parent_block_hash, token_ids, block_size, ...]`, vLLM's earlier encoding):

- BlockStored: `block_hashes` (the new full blocks of one request, in order), the
  `parent_block_hash` of the first (None at the start of a prompt), `token_ids` (the
  blocks' tokens), `block_size`; optional `medium` ("GPU", "CPU", ...), `group_idx`.
- BlockRemoved: `block_hashes` evicted (optional `medium`, `group_idx`).
- AllBlocksCleared: the whole cache was reset.

A block hash is bytes (vLLM's default: sha256) or an integer (VLLM_KV_EVENTS_USE_INT_BLOCK_
HASHES). The input is hostile until checked: sizes are bounded before and while unpacking,
and anything malformed raises `KvEventError` for the whole message (the caller counts and
drops it; a half-applied batch would leave the held set inconsistent). Event types this
decoder does not know are skipped and counted (`KvBatch.unknown`), as a newer engine may add
some. Events about other tiers than the GPU's (`medium` not "GPU") or other KV-cache groups
than the first (hybrid models) are skipped too: prefix hits are decided on group 0 in GPU
memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_EVENTS = 4096  # per batch
MAX_HASHES = 4096  # per event
# per batch: applying 819k hashes (200 events of 4,096) blocked the node's event loop for
# 1.4 s; a step of a real engine stores far fewer blocks (256 sequences x 256 blocks)
MAX_BATCH_HASHES = 65_536
MAX_HASH_BYTES = 64
MAX_BLOCK_SIZE = 4096  # tokens per block
MAX_TOPIC_BYTES = 256
# Any array (token_ids are the longest): the unpacker allocates a declared length up front.
MAX_ARRAY_LEN = 1 << 20
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1

BlockHash = bytes | int


class KvEventError(ValueError):
    """A KV-event message that cannot be used (malformed, oversized, wrong types)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvBatch:
    seq: int
    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None
    unknown: int = 0  # events of a type we do not know, skipped
    skipped: int = 0  # events of another medium or KV-cache group, skipped


# Field order of the array encoding (after the tag).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
)
_REMOVED_FIELDS = ("block_hashes", "medium")


def decode_message(frames: Sequence[bytes], topic: bytes = b"") -> KvBatch:
    """The batch in one ZMQ message (topic, sequence, payload); KvEventError if unusable."""
    if len(frames) != 3:
        raise KvEventError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    got_topic, seq_bytes, payload = frames
    if len(got_topic) > MAX_TOPIC_BYTES or not got_topic.startswith(topic):
        raise KvEventError("unexpected topic")
    if len(seq_bytes) != 8:
        raise KvEventError(f"sequence frame of {len(seq_bytes)} bytes, expected 8")
    return decode_payload(payload, int.from_bytes(seq_bytes, "big", signed=True))


def decode_payload(payload: bytes, seq: int = 0) -> KvBatch:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise KvEventError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}")
    try:
        doc = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_PAYLOAD_BYTES,
            max_bin_len=MAX_HASH_BYTES * 4,
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=64,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types (and ValueError) on bad input
        raise KvEventError(f"not a msgpack payload: {type(exc).__name__}") from None
    if not isinstance(doc, list) or len(doc) not in (2, 3):
        raise KvEventError("a batch is an array [ts, events] or [ts, events, dp_rank]")
    ts, raw_events = doc[0], doc[1]
    dp_rank = doc[2] if len(doc) == 3 else None
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise KvEventError("batch ts is not a number")
    if dp_rank is not None and (not isinstance(dp_rank, int) or isinstance(dp_rank, bool)):
        raise KvEventError("batch data_parallel_rank is not an integer")
    if not isinstance(raw_events, list):
        raise KvEventError("batch events is not an array")
    if len(raw_events) > MAX_EVENTS:
        raise KvEventError(f"{len(raw_events)} events in one batch, over {MAX_EVENTS}")
    events: list[KvEvent] = []
    unknown = skipped = 0
    for raw in raw_events:
        tag, fields = _tagged(raw)
        if tag == "BlockStored":
            stored = _stored(fields)
            if stored is None:
                skipped += 1
            else:
                events.append(stored)
        elif tag == "BlockRemoved":
            if _other_tier(fields):
                skipped += 1
            else:
                events.append(BlockRemoved(_hashes(fields.get("block_hashes"))))
        elif tag == "AllBlocksCleared":
            events.append(AllBlocksCleared())
        else:
            unknown += 1
    hashes = sum(len(e.hashes) for e in events if not isinstance(e, AllBlocksCleared))
    if hashes > MAX_BATCH_HASHES:
        raise KvEventError(f"{hashes} block hashes in one batch, over {MAX_BATCH_HASHES}")
    return KvBatch(seq, float(ts), tuple(events), dp_rank, unknown, skipped)


def _tagged(raw: Any) -> tuple[str, Mapping[str, Any]]:
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KvEventError("an event map without a string 'type'")
        return tag, raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(raw[0], ())
        return raw[0], dict(zip(names, raw[1:], strict=False))
    raise KvEventError("an event is neither a tagged map nor a tagged array")


def _other_tier(fields: Mapping[str, Any]) -> bool:
    medium, group = fields.get("medium"), fields.get("group_idx")
    if medium is not None and not isinstance(medium, str):
        raise KvEventError("event medium is not a string")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
        raise KvEventError("event group_idx is not an integer")
    return (medium is not None and medium.upper() != "GPU") or (group is not None and group != 0)


def _stored(fields: Mapping[str, Any]) -> BlockStored | None:
    hashes = _hashes(fields.get("block_hashes"))
    parent_raw = fields.get("parent_block_hash")
    parent = None if parent_raw is None else _hash(parent_raw)
    size = fields.get("block_size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BLOCK_SIZE:
        raise KvEventError(f"block_size must be an integer in 1..{MAX_BLOCK_SIZE}")
    tokens = fields.get("token_ids", [])
    if not isinstance(tokens, list) or len(tokens) > len(hashes) * size:
        raise KvEventError("token_ids is not an array of at most block_size per block")
    if _other_tier(fields):
        return None
    return BlockStored(hashes, parent, size)


def _hashes(raw: Any) -> tuple[BlockHash, ...]:
    if not isinstance(raw, list):
        raise KvEventError("block_hashes is not an array")
    if len(raw) > MAX_HASHES:
        raise KvEventError(f"{len(raw)} block hashes in one event, over {MAX_HASHES}")
    return tuple(_hash(h) for h in raw)


def _hash(raw: Any) -> BlockHash:
    if isinstance(raw, bytes):
        if not 0 < len(raw) <= MAX_HASH_BYTES:
            raise KvEventError(f"a block hash of {len(raw)} bytes (1..{MAX_HASH_BYTES})")
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool) and _INT_MIN <= raw <= _INT_MAX:
        return raw
    raise KvEventError("a block hash is neither bytes nor a 64-bit integer")
