"""KV-cache events from the simulated engine, in vLLM's wire format (`--kv-events-config`).

What the prefix cache's LRU (sim/prefix_cache.py) does becomes events: a prompt's blocks not
held before are one `BlockStored` (their chain ids as 8-byte hashes, the previous block as
parent, the pseudo token ids of their text, 16 tokens per block), blocks the LRU evicts are
one `BlockRemoved` (the simulated cache is never reset: no `AllBlocksCleared`). A batch per
request is sent as three frames (topic, 8-byte big-endian sequence number, msgpack
`[ts, events]`, events as tagged maps), the way vLLM's ZMQ publisher sends them. Like vLLM,
the publisher binds a wildcard or ipc:// endpoint and connects to any other
(agent/kv_events_config.py); a PUB socket never blocks the engine: past its high-water mark
it drops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgpack

from llmfabric.engines import text

HWM = 10_000


def token_ids(block_text: bytes) -> list[int]:
    """Pseudo token ids: one per CHARS_PER_TOKEN bytes of the block's text."""
    step = text.CHARS_PER_TOKEN
    return [
        int.from_bytes(block_text[i : i + step].ljust(step, b"\0"), "big") % 50_000
        for i in range(0, len(block_text), step)
    ]


def _hash(block_id: int) -> bytes:
    return block_id.to_bytes(8, "big")


class KvEventPublisher:
    def __init__(self, endpoint: str, topic: str = "") -> None:
        import zmq  # (only an engine that publishes events needs pyzmq loaded)

        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.set_hwm(HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)
        self._topic = topic.encode()
        self._seq = 0
        self.sent = 0

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        if not events:
            return
        payload = msgpack.packb([time.time(), list(events)])
        try:
            self._sock.send_multipart(
                (self._topic, self._seq.to_bytes(8, "big"), payload), flags=self._zmq.NOBLOCK
            )
            self.sent += 1
        except self._zmq.Again:  # (nobody keeping up: dropped, as vLLM's publisher does)
            pass
        self._seq += 1

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


def cache_events(
    prompt_text: str, ids: Sequence[int], held_before: Sequence[bool], evicted: Sequence[int]
) -> list[dict[str, Any]]:
    """The events of one prompt's pass through the LRU: its blocks from the first one not
    held before (`held_before[i]`: block i was held) stored, then the evictions."""
    events: list[dict[str, Any]] = []
    first = next((i for i, held in enumerate(held_before) if not held), len(ids))
    if first < len(ids):
        data = prompt_text.encode()
        size = text.BLOCK_CHARS
        tokens = token_ids(data[first * size : len(ids) * size])
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": [_hash(b) for b in ids[first:]],
                "parent_block_hash": _hash(ids[first - 1]) if first else None,
                "token_ids": tokens,
                "block_size": text.BLOCK_TOKENS,
                "lora_id": None,
                "medium": "GPU",
            }
        )
    if evicted:
        events.append(
            {"type": "BlockRemoved", "block_hashes": [_hash(b) for b in evicted], "medium": "GPU"}
        )
    return events
