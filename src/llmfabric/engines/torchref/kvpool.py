"""KV Cache Adaptor (Flying Serving §4.2): one pool per engine, allocated once, whose blocks
are reinterpreted by the width of the request that owns them.

The pool tensor is [layers, 2 (K, V), n_blocks, B_DP x kv_dim]: a block index spans every
layer, so a block always has the same bytes. At width W a block holds B_DP x W tokens of
kv_dim / W values (the local KV heads of one rank), so token p of a request lives at
block table[p // (B_DP W)], offset p mod (B_DP W). DP and TP block tables coexist in one
pool: requests paused by a hard preempt keep their blocks untouched.

The scheduler's side, a free list of block ids per engine, is blocks.BlockAllocator.
"""

from __future__ import annotations

import torch

from llmfabric.engines.torchref.config import ModelConfig


class KVPool:
    def __init__(self, cfg: ModelConfig, n_blocks: int, block_tokens: int) -> None:
        self.cfg = cfg
        self.n_blocks = n_blocks
        self.block_tokens = block_tokens
        self.tensor = torch.zeros(cfg.layers, 2, n_blocks, block_tokens * cfg.kv_dim)

    def layer(self, layer: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as [n_blocks x B_DP x W, kv_dim / W] views of the pool."""
        rows = self.n_blocks * self.block_tokens * width
        cols = self.cfg.kv_dim // width
        return self.tensor[layer, 0].view(rows, cols), self.tensor[layer, 1].view(rows, cols)

    def slots(self, table: list[int], start: int, end: int, width: int) -> torch.Tensor:
        """Row indices (in `layer()`'s views) of positions [start, end) of a request."""
        per_block = self.block_tokens * width
        pos = torch.arange(start, end)
        blocks = torch.tensor(table, dtype=torch.long)[pos // per_block]
        return blocks * per_block + pos % per_block
