"""Memory-aware pipeline layer splits for stages of different GPUs (ThunderServe App. B).

Splitting layers by speed alone (`parallel.balanced_layer_split` with memory bandwidth x TP)
starves the KV cache of small-memory stages: LLaMA-30B over 2 x A40 + 2 x RTX 3090 Ti stages
gets 25/35 layers and the 3090 Ti stage keeps room for only a few hundred KV tokens, while a
replica's KV capacity is its smallest stage's. `layer_caps` bounds each stage by what its
memory holds beside `kv_min_tokens` of KV for every layer it keeps:

    cap_s = floor((mem_s x util - reserve_s - embedding/head_s) / (layer_s + kv_min x kv_layer_s))

(all per GPU of the stage), and `memory_aware_layers` water-fills the speed-proportional
split under those caps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.memory import stage_kv_bytes_per_token, stage_reserve_bytes, stage_weight_bytes
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import Deployment, Stage, balanced_layer_split


def default_kv_min_tokens(model: ModelSpec) -> int:
    """One full context, capped at 4096 tokens (as `memory.fits`)."""
    return min(model.max_context, 4096)


def layer_caps(model: ModelSpec | str, gpus: Sequence[GPUSpec | str], tps: Sequence[int], *,
               kv_min_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
               max_batched_tokens: int = 8192) -> list[int]:
    """The most layers each stage (GPU type, TP) can hold with `kv_min_tokens` of KV room."""
    spec = get_model(model)
    if len(gpus) != len(tps) or not gpus:
        raise SpecError("give one tp per stage GPU, at least one stage")
    kv_min = default_kv_min_tokens(spec) if kv_min_tokens is None else kv_min_tokens
    if kv_min < 0:
        raise SpecError("kv_min_tokens must be >= 0")
    caps = []
    last = len(gpus) - 1
    for i, (g, tp) in enumerate(zip(gpus, tps, strict=True)):
        gpu = get_gpu(g)
        fixed = stage_weight_bytes(spec, tp, 0, i == 0, i == last)
        per_layer = (stage_weight_bytes(spec, tp, 1, False, False)
                     + kv_min * stage_kv_bytes_per_token(spec, tp, 1))
        free = (gpu.mem_bytes * gpu_memory_utilization - fixed
                - stage_reserve_bytes(spec, tp, max_batched_tokens))
        caps.append(max(0, math.floor(free / per_layer)))
    return caps


def memory_aware_layers(model: ModelSpec | str, gpus: Sequence[GPUSpec | str],
                        tps: Sequence[int], *, weights: Sequence[float] | None = None,
                        kv_min_tokens: int | None = None,
                        gpu_memory_utilization: float = 0.9,
                        max_batched_tokens: int = 8192) -> list[int]:
    """Layers per stage: proportional to `weights` (default: memory bandwidth x TP, decode's
    speed) under `layer_caps`. Raises InfeasibleError when the stages cannot hold the model
    with that much KV room."""
    spec = get_model(model)
    specs = [get_gpu(g) for g in gpus]
    w = list(weights) if weights is not None else [g.mem_bw * t for g, t in zip(specs, tps,
                                                                               strict=True)]
    caps = layer_caps(spec, specs, tps, kv_min_tokens=kv_min_tokens,
                      gpu_memory_utilization=gpu_memory_utilization,
                      max_batched_tokens=max_batched_tokens)
    return balanced_layer_split(spec.n_layers, w, caps)


def memory_aware_deployment(model: ModelSpec | str, gpus: Sequence[GPUSpec | str],
                            tps: Sequence[int], **kwargs: int | float | None) -> Deployment:
    """A Deployment with one stage per (GPU, TP) and `memory_aware_layers`."""
    spec = get_model(model)
    layers = memory_aware_layers(spec, gpus, tps, **kwargs)  # type: ignore[arg-type]
    return Deployment(spec, tuple(Stage(get_gpu(g), t, n)
                                  for g, t, n in zip(gpus, tps, layers, strict=True)))
