"""Per-layer operator accounting (FLOPs and bytes moved), in the style of LLM-Viewer.

Linear operators (q/k/v/o projections, MLP gate/up/down, MoE experts, LM head) cost
`flops_per_token * m` FLOPs and move `weight_bytes + act_bytes_per_token * m` bytes for a step of
`m` tokens. Attention (score Q.K^T, softmax, value P.V) depends on the context each token sees.
All numbers are PER GPU under tensor parallelism `tp` (heads and MLP columns are sharded;
norms, residual adds and embeddings are replicated). FLOPs count a multiply-add as 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.sim.models import ModelSpec

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class OpCost:
    """FLOPs and bytes of one operator for one step (per GPU); `tensor`: runs on tensor cores."""

    name: str
    flops: float
    bytes: float
    tensor: bool = True


@dataclass(frozen=True, slots=True)
class LinearOp:
    """An operator whose cost is affine in the number of tokens m of the step."""

    name: str
    flops_per_token: float
    weight_bytes: float
    act_bytes_per_token: float
    tensor: bool = True
    moe_experts: int = 1  # >1: weight bytes scale with the expected number of experts touched
    moe_top_k: int = 1
    gemm_n: int = 0  # a dense GEMM's output features and reduction length (0: not a known
    gemm_k: int = 0  # GEMM shape); used by the shape-aware low-precision efficiency

    def weights_touched(self, m: FloatArray | float) -> FloatArray | float:
        if self.moe_experts <= 1:
            return self.weight_bytes
        e, k = self.moe_experts, self.moe_top_k
        frac = 1.0 - np.power(1.0 - k / e, np.maximum(m, 0.0))
        return self.weight_bytes * frac

    def cost(self, m: int) -> OpCost:
        return OpCost(self.name, self.flops_per_token * m,
                      float(self.weights_touched(float(m))) + self.act_bytes_per_token * m,
                      self.tensor)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def layer_linear_ops(model: ModelSpec, tp: int = 1) -> tuple[LinearOp, ...]:
    """The token-linear operators of ONE transformer layer, per GPU."""
    wb = model.weight_bits / 8
    ab = model.act_bits / 8
    h = model.hidden
    q = _ceil_div(model.q_dim, tp)
    kv = _ceil_div(model.kv_dim, tp) if model.n_kv_heads >= tp else model.head_dim
    f = _ceil_div(model.ffn_hidden, tp)
    # vLLM's layer: fused residual-add + RMSNorm, fused QKV GEMM, rotary embedding, output
    # projection, fused add + norm, fused gate/up GEMM, SiLU-and-mul, down projection.
    qkv = q + 2 * kv
    ops = [
        LinearOp("input_norm", 5 * h, h * wb, 4 * h * ab, tensor=False),
        LinearOp("qkv_proj", 2 * h * qkv, h * qkv * wb, (h + qkv) * ab, gemm_n=qkv, gemm_k=h),
        LinearOp("rope", 3 * (q + kv), 0.0, 2 * (q + kv) * ab, tensor=False),
        LinearOp("o_proj", 2 * q * h, q * h * wb, (q + h) * ab, gemm_n=h, gemm_k=q),
        LinearOp("post_attn_norm", 5 * h, h * wb, 4 * h * ab, tensor=False),
    ]
    k = model.experts_per_token
    e = model.n_experts
    if e > 1:
        ops.append(LinearOp("moe_router", 2 * h * e, h * e * wb, (h + e) * ab))
    in_mats = 2 if model.gated_mlp else 1
    dense = e <= 1  # MoE expert GEMMs have other shapes: no shape term for them
    ops.append(LinearOp("mlp_gate_up", 2 * h * f * in_mats * k, h * f * in_mats * wb * e,
                        (h + f * in_mats) * k * ab, moe_experts=e, moe_top_k=k,
                        gemm_n=f * in_mats if dense else 0, gemm_k=h if dense else 0))
    ops.append(LinearOp("mlp_act", (4 if model.gated_mlp else 1) * f * k, 0.0,
                        (f * in_mats + f) * k * ab, tensor=False))
    ops.append(LinearOp("mlp_down", 2 * f * h * k, f * h * wb * e, (f + h) * k * ab,
                        moe_experts=e, moe_top_k=k, gemm_n=h if dense else 0,
                        gemm_k=f if dense else 0))
    return tuple(ops)


def lm_head_op(model: ModelSpec, tp: int = 1) -> LinearOp:
    """Final norm + LM head, applied to ONE token per sequence (the sampled position)."""
    v = _ceil_div(model.vocab, tp)
    wb = model.weight_bits / 8
    ab = model.act_bits / 8
    return LinearOp("lm_head", 2 * model.hidden * v + 4 * model.hidden,
                    model.hidden * v * wb + model.hidden * wb,
                    (model.hidden + v) * ab + 4 * v)


def embedding_op(model: ModelSpec) -> LinearOp:
    return LinearOp("embedding", 0.0, 0.0, 2 * model.hidden * model.act_bits / 8, tensor=False)


def _heads(model: ModelSpec, tp: int) -> tuple[int, int]:
    return _ceil_div(model.n_heads, tp), max(1, _ceil_div(model.n_kv_heads, tp))


def heads_per_gpu(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) of one GPU's shard under tensor parallelism `tp`."""
    return _heads(model, tp)


def attention_prefill_ops(model: ModelSpec, tp: int, chunk: int, prefix: int = 0
                          ) -> tuple[OpCost, OpCost, OpCost]:
    """Causal attention of `chunk` new tokens that also see `prefix` cached tokens, one layer.

    Token i of the chunk attends to prefix + i + 1 keys; the mean is prefix + (chunk + 1) / 2.
    Memory: fused (FlashAttention) kernels read Q, the K/V of prefix + chunk tokens, write O.
    """
    nh, nkv = _heads(model, tp)
    d = model.head_dim
    ab = model.act_bits / 8
    kvb = model.kv_bits / 8
    pairs = chunk * (prefix + (chunk + 1) / 2)
    score = OpCost("attn_score", 2 * nh * d * pairs,
                   chunk * nh * d * ab + (prefix + chunk) * nkv * d * kvb)
    softmax = OpCost("attn_softmax", 5 * nh * pairs, 0.0, tensor=False)
    value = OpCost("attn_value", 2 * nh * d * pairs,
                   (prefix + chunk) * nkv * d * kvb + chunk * nh * d * ab)
    return score, softmax, value


def attention_decode_ops(model: ModelSpec, tp: int, batch: int, total_context: float
                         ) -> tuple[OpCost, OpCost, OpCost]:
    """One new token per sequence against the KV cache, `total_context` keys over the batch."""
    nh, nkv = _heads(model, tp)
    d = model.head_dim
    ab = model.act_bits / 8
    kvb = model.kv_bits / 8
    score = OpCost("attn_score", 2 * nh * d * total_context,
                   batch * nh * d * ab + total_context * nkv * d * kvb)
    softmax = OpCost("attn_softmax", 5 * nh * total_context, 0.0, tensor=False)
    value = OpCost("attn_value", 2 * nh * d * total_context,
                   total_context * nkv * d * kvb + batch * nh * d * ab)
    return score, softmax, value


def tp_allreduce_bytes_per_token(model: ModelSpec) -> float:
    """Bytes all-reduced per token per layer under TP: attention output + MLP output."""
    return 2 * model.hidden * model.act_bits / 8
