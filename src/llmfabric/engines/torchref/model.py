"""The Llama forward pass over a ragged batch with paged KV, at any width.

One call runs every entry of a step (continuous batching: prefills and decodes together).
At width W the rank's weight views hold heads / W query heads, kv_heads / W KV heads and
intermediate / W MLP columns; the O and down projections give partial sums that one
all-reduce per attention block and one per MLP completes. With W = 1 there is no collective
and the same code is plain data-parallel inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from llmfabric.engines.torchref.config import ModelConfig
from llmfabric.engines.torchref.kvpool import KVPool
from llmfabric.engines.torchref.plans import Entry
from llmfabric.engines.torchref.weights import LayerWeights, Weights


@dataclass(frozen=True, slots=True)
class EntryOutput:
    rid: int
    logits: torch.Tensor  # [vocab] at the last position
    token_logprobs: list[float] | None  # log p(tokens[i+1] | ...) for the given tokens


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(pos: torch.Tensor, head_dim: int, theta: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved halves (the HF Llama convention: first half with second half)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q [n, hq, d] at positions start.., k/v [start + n, hkv, d]; causal; GQA by repeat."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    n, total = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    qpos = torch.arange(start, start + n)[:, None]
    mask = torch.arange(total)[None, :] > qpos
    scores = scores.masked_fill(mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def forward(cfg: ModelConfig, weights: Weights, layers: tuple[LayerWeights, ...], pool: KVPool,
            width: int, group: dist.ProcessGroup | None, entries: list[Entry]
            ) -> list[EntryOutput]:
    if not entries:
        return []
    hd = cfg.head_dim
    tokens = torch.tensor([t for e in entries for t in e.tokens], dtype=torch.long)
    pos = torch.cat([torch.arange(e.start, e.start + len(e.tokens)) for e in entries])
    cos, sin = rope_tables(pos, hd, cfg.rope_theta)
    new_slots = torch.cat([pool.slots(e.table, e.start, e.start + len(e.tokens), width)
                           for e in entries])
    all_slots = [pool.slots(e.table, 0, e.start + len(e.tokens), width) for e in entries]
    bounds = [0]
    for e in entries:
        bounds.append(bounds[-1] + len(e.tokens))
    n = len(tokens)
    x = weights.embed[tokens]
    for li, lw in enumerate(layers):
        h = rms_norm(x, lw.attn_norm, cfg.norm_eps)
        q = apply_rope(F.linear(h, lw.wq).view(n, lw.heads, hd), cos, sin)
        k = apply_rope(F.linear(h, lw.wk).view(n, lw.kv_heads, hd), cos, sin)
        v = F.linear(h, lw.wv)
        kcache, vcache = pool.layer(li, width)
        kcache[new_slots] = k.reshape(n, -1)
        vcache[new_slots] = v
        attn = torch.empty(n, lw.heads, hd)
        for i, e in enumerate(entries):
            a, b = bounds[i], bounds[i + 1]
            kk = kcache[all_slots[i]].view(-1, lw.kv_heads, hd)
            vv = vcache[all_slots[i]].view(-1, lw.kv_heads, hd)
            attn[a:b] = _attention(q[a:b], kk, vv, e.start)
        o = F.linear(attn.view(n, -1), lw.wo)
        if group is not None:
            dist.all_reduce(o, group=group)
        x = x + o
        h = rms_norm(x, lw.mlp_norm, cfg.norm_eps)
        m = F.linear(F.silu(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)
        if group is not None:
            dist.all_reduce(m, group=group)
        x = x + m
    x = rms_norm(x, weights.norm, cfg.norm_eps)
    out: list[EntryOutput] = []
    for i, e in enumerate(entries):
        a, b = bounds[i], bounds[i + 1]
        if e.all_logprobs:
            logits = F.linear(x[a:b], weights.lm_head)
            lp = torch.log_softmax(logits[:-1], dim=-1)
            given = torch.tensor(e.tokens[1:], dtype=torch.long)
            token_lp = lp.gather(1, given[:, None])[:, 0].tolist()
            out.append(EntryOutput(e.rid, logits[-1], token_lp))
        else:
            out.append(EntryOutput(e.rid, F.linear(x[b - 1], weights.lm_head), None))
    return out
