"""The scheduler's side of the KV Cache Adaptor: free block ids of each engine's pool.

A request of width W reserves ceil(tokens / (B_DP x W)) blocks on every member engine, for
its prompt and its whole output, at admission (kvpool.py gives the layout of a block)."""

from __future__ import annotations

import math


class BlockAllocator:
    """Free block ids of one engine's pool (lowest first, so runs are reproducible)."""

    def __init__(self, n_blocks: int, block_tokens: int) -> None:
        self.n_blocks = n_blocks
        self.block_tokens = block_tokens
        self._free = list(range(n_blocks - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int, width: int) -> int:
        return math.ceil(tokens / (self.block_tokens * width))

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"{n} KV blocks wanted, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        self._free.sort(reverse=True)
