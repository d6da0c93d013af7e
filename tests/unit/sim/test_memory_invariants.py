"""Memory feasibility and cost-model invariants (properties)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import (
    ModelSpec,
    cost_model,
    decode_step_time,
    efficiency_for,
    fits,
    get_gpu,
    get_model,
    max_kv_tokens,
    plan_memory,
    prefill_time,
    weight_bytes,
)
from llmfabric.sim.memory import stage_weight_bytes
from llmfabric.sim.parallel import balanced_layer_split, make_deployment

GPUS = ["A100-80GB", "H100-SXM", "L40S", "RTX-4090", "MI300X", "V100"]
MODELS = ["llama-2-7b", "llama-3.1-8b", "qwen3-1.7b", "mixtral-8x7b", "llama-2-70b"]


def test_weight_bytes_hand_computed(tiny: ModelSpec) -> None:
    per_layer = (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) * 2 + 2 * 64 * 2
    embeddings = 2 * 100 * 64 * 2  # untied: embedding + LM head
    assert weight_bytes(tiny) == 2 * per_layer + embeddings + 64 * 2


def test_fits_examples() -> None:
    assert fits("llama-3.1-8b", "H100")
    assert not fits("llama-3.1-70b", "H100", tp=1)
    assert fits("llama-3.1-70b", "H100", tp=4)
    assert not fits("llama-2-13b", "RTX-4090")
    assert fits("llama-2-13b", "RTX-4090", tp=2)
    q4 = get_model("llama-2-13b").with_quantization(weight_bits=4)
    assert fits(q4, "RTX-4090")


def test_kv_capacity_hand_check() -> None:
    plan = plan_memory("llama-3.1-8b", "H100-SXM")
    free = 80e9 * 0.9 - plan.weight_bytes_per_gpu - plan.reserve_bytes_per_gpu
    per_token = 2 * 32 * 8 * 128 * 2  # K+V, layers, kv heads, head dim, bf16
    assert plan.kv_bytes_per_token_per_gpu == per_token
    assert plan.kv_capacity_tokens == int(free / per_token) // 16 * 16


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpu", GPUS)
def test_tp_never_increases_per_gpu_weight_bytes(model: str, gpu: str) -> None:
    spec = get_model(model)
    prev = float("inf")
    for tp in (1, 2, 4, 8):
        w = stage_weight_bytes(spec, tp, spec.n_layers, True, True)
        assert w <= prev
        prev = w
    assert max_kv_tokens(spec, gpu, tp=8) >= max_kv_tokens(spec, gpu, tp=4)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 256), ctx=st.integers(0, 8000), scale=st.floats(1.0, 8.0),
       model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS))
def test_more_bandwidth_never_slows_decode(batch: int, ctx: int, scale: float, model: str,
                                           gpu: str) -> None:
    base = get_gpu(gpu)
    faster = dataclasses.replace(base, name=base.name + "-fast", mem_bw=base.mem_bw * scale)
    eff = efficiency_for(base)  # same kernels, only the bandwidth differs
    t0 = decode_step_time(model, base, 1, batch, ctx, efficiency=eff)
    t1 = decode_step_time(model, faster, 1, batch, ctx, efficiency=eff)
    assert t1 <= t0 + 1e-15


@settings(max_examples=40, deadline=None)
@given(b1=st.integers(1, 200), b2=st.integers(1, 200), ctx=st.integers(0, 4000),
       gpu=st.sampled_from(GPUS))
def test_decode_monotone_in_batch_and_context(b1: int, b2: int, ctx: int, gpu: str) -> None:
    lo, hi = sorted((b1, b2))
    assert decode_step_time("llama-3.1-8b", gpu, 1, lo, ctx) <= decode_step_time(
        "llama-3.1-8b", gpu, 1, hi, ctx)
    assert decode_step_time("llama-3.1-8b", gpu, 1, lo, ctx) <= decode_step_time(
        "llama-3.1-8b", gpu, 1, lo, ctx + 100)


def test_prefill_grows_with_tokens_and_faster_gpu_is_faster() -> None:
    times = [prefill_time("llama-3.1-8b", "H100", 1, n) for n in (128, 512, 2048, 8192)]
    assert times == sorted(times)
    assert prefill_time("llama-3.1-8b", "H100", 1, 2048) < prefill_time(
        "llama-3.1-8b", "A100", 1, 2048)


def test_tp_speeds_up_large_model_decode() -> None:
    t2 = decode_step_time("llama-2-70b", "H100", 2, 8, 1000)
    t8 = decode_step_time("llama-2-70b", "H100", 8, 8, 1000)
    assert t8 < t2


def test_pipeline_split_non_uniform_for_mixed_gpus() -> None:
    assert balanced_layer_split(80, [2.0, 1.0]) == [53, 27]
    assert sum(balanced_layer_split(7, [1, 1, 1])) == 7
    dep = make_deployment("llama-2-70b", ["H100", "A100-80GB"], tp=[2, 2])
    assert dep.stages[0].n_layers > dep.stages[1].n_layers
    cm = cost_model("llama-2-70b", "H100", tp=2, pp=2)
    assert cm.deployment.pp == 2
    assert cm.decode_step_time(4, 4000) > 0
