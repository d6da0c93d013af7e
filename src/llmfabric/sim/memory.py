"""Memory feasibility: weight bytes, KV bytes per token, and KV capacity per replica.

Per GPU of each pipeline stage: usable = memory x gpu_memory_utilization; from it subtract the
stage's weight shard and a runtime reserve (CUDA context, NCCL buffers, activations of a
`max_batched_tokens` step); what is left holds the KV cache, split into blocks of `block_size`
tokens as vLLM's PagedAttention does. A replica's KV capacity is the smallest over its stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import Deployment, make_deployment

GIB = 1024**3
RUNTIME_RESERVE_BYTES = 1.0 * GIB  # CUDA context, allocator slack, cuBLAS workspace
NCCL_RESERVE_BYTES = 0.4 * GIB  # per GPU when tp > 1 (aiconfigurator's nccl_mem, ~392 MB)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    weight_bytes_per_gpu: float  # the largest stage's shard
    kv_bytes_per_token_per_gpu: float  # the largest over stages
    reserve_bytes_per_gpu: float
    kv_capacity_tokens: int  # rounded down to whole blocks
    block_size: int
    fits: bool  # at least `min_kv_tokens` of KV fit beside the weights

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size


def stage_weight_bytes(model: ModelSpec, tp: int, n_layers: int, first: bool, last: bool
                       ) -> float:
    """Bytes of weights per GPU of a stage: sharded attention/MLP, replicated norms."""
    wb = model.weight_bits / 8
    sharded = (model.attn_params_per_layer() + model.mlp_params_per_layer()) / tp
    per_layer = sharded * wb + 2 * model.hidden * wb
    total = n_layers * per_layer
    emb = model.vocab * model.hidden * wb / tp
    if first:
        total += emb
    if last:
        total += model.hidden * wb + (0.0 if model.tied_embeddings and first else emb)
    return total


def stage_kv_bytes_per_token(model: ModelSpec, tp: int, n_layers: int) -> float:
    kv_heads = max(1, -(-model.n_kv_heads // tp))  # replicated when tp > n_kv_heads
    return 2 * n_layers * kv_heads * model.head_dim * model.kv_bits / 8


def stage_reserve_bytes(model: ModelSpec, tp: int, max_batched_tokens: int = 8192) -> float:
    """Runtime reserve per GPU of a stage: CUDA context, NCCL buffers (tp > 1) and the
    activations of one `max_batched_tokens` step."""
    act = max_batched_tokens * (4 * model.hidden + 3 * model.ffn_hidden / tp) * 2
    return RUNTIME_RESERVE_BYTES + (NCCL_RESERVE_BYTES if tp > 1 else 0.0) + act


def memory_plan(dep: Deployment, *, gpu_memory_utilization: float = 0.9,
                max_batched_tokens: int = 8192, block_size: int = 16,
                min_kv_tokens: int | None = None) -> MemoryPlan:
    model = dep.model
    need = block_size if min_kv_tokens is None else min_kv_tokens
    capacity = float("inf")
    weights = kv_per_tok = reserve_max = 0.0
    for i, st in enumerate(dep.stages):
        w = stage_weight_bytes(model, st.tp, st.n_layers, i == 0, i == dep.pp - 1)
        kv = stage_kv_bytes_per_token(model, st.tp, st.n_layers)
        reserve = stage_reserve_bytes(model, st.tp, max_batched_tokens)
        free = st.gpu.mem_bytes * gpu_memory_utilization - w - reserve
        capacity = min(capacity, free / kv if kv > 0 else float("inf"))
        weights, kv_per_tok = max(weights, w), max(kv_per_tok, kv)
        reserve_max = max(reserve_max, reserve)
    tokens = max(0, int(capacity) // block_size * block_size)
    return MemoryPlan(weights, kv_per_tok, reserve_max, tokens, block_size, tokens >= need)


def plan_memory(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, pp: int = 1,
                **kwargs: float | int | None) -> MemoryPlan:
    """`memory_plan` for `pp` equal stages of `tp` x `gpu` (see memory_plan for kwargs)."""
    dep = make_deployment(get_model(model), get_gpu(gpu), tp, pp)
    return memory_plan(dep, **kwargs)  # type: ignore[arg-type]


def fits(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, pp: int = 1, *,
         min_kv_tokens: int | None = None, gpu_memory_utilization: float = 0.9) -> bool:
    """True if the weights fit on `pp` x `tp` GPUs with room for `min_kv_tokens` of KV
    (default: the model's context length, capped at 4096 tokens)."""
    spec = get_model(model)
    need = min(spec.max_context, 4096) if min_kv_tokens is None else min_kv_tokens
    plan = plan_memory(spec, gpu, tp, pp, min_kv_tokens=need,
                       gpu_memory_utilization=gpu_memory_utilization)
    return plan.fits


def max_kv_tokens(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, pp: int = 1, *,
                  gpu_memory_utilization: float = 0.9) -> int:
    return plan_memory(model, gpu, tp, pp,
                       gpu_memory_utilization=gpu_memory_utilization).kv_capacity_tokens


def weight_bytes(model: ModelSpec | str) -> float:
    """Total weight bytes of the model (all GPUs together)."""
    spec = get_model(model)
    return stage_weight_bytes(spec, 1, spec.n_layers, True, True)
