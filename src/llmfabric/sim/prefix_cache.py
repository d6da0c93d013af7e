"""Prefix caching for the simulator: an LRU over KV blocks and an engine whose prefill skips them.

Blocks are named by chain ids (a Mooncake trace's `hash_ids`, one per 512-token block: id i
names blocks 0..i of its prompt), so a prompt's cached part is its longest leading run of
ids the cache holds, as in vLLM's automatic prefix caching. The LRU holds at most the
engine's KV capacity in blocks; a served prompt's blocks become most recent.

`PrefixEngine` is a deliberately small model for routing studies: one FCFS prefill server
whose service time is `prefill_s(uncached tokens)` (the simulator's roofline `prefill_time`,
or any callable) and decode running beside prefill (chunked prefill), so it only holds the
request in flight. A prompt's blocks are cached when its prefill ends; under FCFS that is
before any later submission's prefill starts, so `submit` updates the cache at once. Time is
the caller's (discrete events); nothing here reads a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class BlockLRU:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` held (and touched, as a prefix-cache hit does)."""
        n = 0
        for b in blocks:
            if b not in self._blocks:
                break
            self._blocks.move_to_end(b)
            n += 1
        return n

    def insert(self, blocks: Sequence[int]) -> list[int]:
        """Make `blocks` the most recent; returns the blocks evicted to make room."""
        for b in blocks:
            self._blocks[b] = None
            self._blocks.move_to_end(b)
        evicted: list[int] = []
        while len(self._blocks) > self.capacity:
            evicted.append(self._blocks.popitem(last=False)[0])
        return evicted

    def recent(self, n: int) -> list[int]:
        """The `n` most recently used blocks."""
        out: list[int] = []
        for b in reversed(self._blocks):
            if len(out) >= n:
                break
            out.append(b)
        return out


@dataclass(slots=True)
class Prefill:
    """One request's prefill on an engine."""

    rid: int
    arrival: float
    blocks: tuple[int, ...]
    tokens: int
    start: float = 0.0
    end: float = 0.0
    cached_tokens: int = 0


class PrefixEngine:
    def __init__(self, kv_blocks: int, block_tokens: int,
                 prefill_s: Callable[[int], float]) -> None:
        self.cache = BlockLRU(kv_blocks)
        self.block_tokens = block_tokens
        self.prefill_s = prefill_s
        self.free_at = 0.0  # when the prefill server is next idle
        self.busy_s = 0.0  # prefill seconds spent
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def submit(self, p: Prefill) -> Prefill:
        """Queue `p` behind earlier prefills (FCFS); fills in start, end and the cache hit.
        Submissions must come in arrival order (the caller's event loop)."""
        p.start = max(p.arrival, self.free_at)
        hit = self.cache.match(p.blocks)
        p.cached_tokens = min(p.tokens, hit * self.block_tokens)
        todo = p.tokens - p.cached_tokens
        dur = self.prefill_s(todo) if todo > 0 else self.prefill_s(1)
        p.end = p.start + dur
        self.free_at = p.end
        self.busy_s += dur
        self.cache.insert(p.blocks)
        self.hit_tokens += p.cached_tokens
        self.prompt_tokens += p.tokens
        return p
