"""Model Weights Manager (Flying Serving §4.1): every engine holds a full, seeded weight
replica that never moves; a W-wide group uses zero-copy shard views of it.

Column-parallel layers (Q, K, V, gate, up) narrow the output dimension (dim 0 of the
[out, in] matrix: a contiguous slice); row-parallel layers (O, down) narrow the input
dimension (dim 1: a strided view, a valid GEMM operand) and are followed by one all-reduce.
Embedding, norms and LM head stay replicated. Q, K and V are separate matrices, so no fused
[Q;K;V] needs three narrows.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import torch

from llmfabric.engines.torchref.config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    heads: int  # query heads held (all of them, or heads / W in a shard)
    kv_heads: int


@dataclass(frozen=True, slots=True)
class Weights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    lm_head: torch.Tensor


def init_weights(cfg: ModelConfig) -> Weights:
    """Seeded random weights, identical bytes in every process for the same config; or the
    trained checkpoint that `cfg.checkpoint` names."""
    if cfg.checkpoint:
        try:
            state = torch.load(cfg.checkpoint, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
            raise ValueError(f"{cfg.checkpoint}: not a readable checkpoint ({exc})") from exc
        if not isinstance(state, dict):
            raise ValueError(f"{cfg.checkpoint}: not a checkpoint of named tensors")
        return weights_from_state(cfg, state)
    gen = torch.Generator().manual_seed(cfg.seed)
    h, kv, f, hd = cfg.hidden, cfg.kv_dim, cfg.intermediate, cfg.head_dim

    def mat(out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=gen) * (1.0 / math.sqrt(inp))

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(h, generator=gen)

    layers = tuple(
        LayerWeights(attn_norm=norm(), wq=mat(cfg.heads * hd, h), wk=mat(kv, h),
                     wv=mat(kv, h), wo=mat(h, cfg.heads * hd), mlp_norm=norm(),
                     w_gate=mat(f, h), w_up=mat(f, h), w_down=mat(h, f), heads=cfg.heads,
                     kv_heads=cfg.kv_heads)
        for _ in range(cfg.layers)
    )
    embed = torch.randn(cfg.vocab_size, h, generator=gen)
    return Weights(embed=embed, layers=layers, norm=norm(), lm_head=mat(cfg.vocab_size, h))


_LAYER_FIELDS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def weights_to_state(weights: Weights) -> dict[str, torch.Tensor]:
    """Named tensors (what a checkpoint file holds): embed, norm, lm_head, layers.i.field."""
    out = {"embed": weights.embed, "norm": weights.norm, "lm_head": weights.lm_head}
    for i, lw in enumerate(weights.layers):
        out.update({f"layers.{i}.{name}": getattr(lw, name) for name in _LAYER_FIELDS})
    return out


def weights_from_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Weights:
    """Weights from named tensors, each checked against the shape `cfg` implies."""
    template = weights_to_state(_shapes(cfg))
    if set(state) != set(template):
        missing, extra = sorted(set(template) - set(state)), sorted(set(state) - set(template))
        raise ValueError(f"checkpoint does not match {cfg.name}: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    for name, want in template.items():
        got = state[name]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"checkpoint tensor {name}: shape "
                             f"{getattr(got, 'shape', None)}, {cfg.name} needs "
                             f"{tuple(want.shape)}")
    return assemble_weights(cfg, {k: v.detach().to(torch.float32).contiguous()
                                  for k, v in state.items()})


def assemble_weights(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Weights:
    """Weights over these very tensors (no copy, no check: gradients reach them)."""
    layers = tuple(LayerWeights(**{f: state[f"layers.{i}.{f}"] for f in _LAYER_FIELDS},
                                heads=cfg.heads, kv_heads=cfg.kv_heads)
                   for i in range(cfg.layers))
    return Weights(state["embed"], layers, state["norm"], state["lm_head"])


def _shapes(cfg: ModelConfig) -> Weights:
    """Weights of the right shapes (meta tensors: no memory)."""
    h, kv, f, hd = cfg.hidden, cfg.kv_dim, cfg.intermediate, cfg.head_dim

    def m(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, device="meta")

    layers = tuple(LayerWeights(m(h), m(cfg.heads * hd, h), m(kv, h), m(kv, h),
                                m(h, cfg.heads * hd), m(h), m(f, h), m(f, h), m(h, f),
                                cfg.heads, cfg.kv_heads) for _ in range(cfg.layers))
    return Weights(m(cfg.vocab_size, h), layers, m(h), m(cfg.vocab_size, h))


class WeightsManager:
    """Shard views per (width, rank), built on first use and cached (they are only views)."""

    def __init__(self, cfg: ModelConfig, weights: Weights) -> None:
        self.cfg = cfg
        self.full = weights
        self._views: dict[tuple[int, int], tuple[LayerWeights, ...]] = {}

    def shard(self, width: int, rank: int) -> tuple[LayerWeights, ...]:
        if width == 1:
            return self.full.layers
        key = (width, rank)
        if key not in self._views:
            self.cfg.check_width(width)
            self._views[key] = tuple(self._narrow(lw, width, rank) for lw in self.full.layers)
        return self._views[key]

    def _narrow(self, lw: LayerWeights, width: int, rank: int) -> LayerWeights:
        hd = self.cfg.head_dim
        hq, hkv, f = lw.heads // width, lw.kv_heads // width, self.cfg.intermediate // width
        return LayerWeights(
            attn_norm=lw.attn_norm,
            wq=lw.wq.narrow(0, rank * hq * hd, hq * hd),
            wk=lw.wk.narrow(0, rank * hkv * hd, hkv * hd),
            wv=lw.wv.narrow(0, rank * hkv * hd, hkv * hd),
            wo=lw.wo.narrow(1, rank * hq * hd, hq * hd),
            mlp_norm=lw.mlp_norm,
            w_gate=lw.w_gate.narrow(0, rank * f, f),
            w_up=lw.w_up.narrow(0, rank * f, f),
            w_down=lw.w_down.narrow(1, rank * f, f),
            heads=hq,
            kv_heads=hkv,
        )

    def storages(self) -> set[int]:
        """Storage addresses of every parameter (views must add none)."""
        out = {self.full.embed.untyped_storage().data_ptr(),
               self.full.norm.untyped_storage().data_ptr(),
               self.full.lm_head.untyped_storage().data_ptr()}
        for layers in (self.full.layers, *self._views.values()):
            for lw in layers:
                for t in (lw.attn_norm, lw.wq, lw.wk, lw.wv, lw.wo, lw.mlp_norm, lw.w_gate,
                          lw.w_up, lw.w_down):
                    out.add(t.untyped_storage().data_ptr())
        return out
