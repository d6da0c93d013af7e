"""Decode-attention thread-block waves (Efficiency.decode_wave_s) and warm-L2 microbenchmark
reads (Efficiency.l2_speedup): hand-computed costs and invariants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import (
    Efficiency,
    GPUSpec,
    ModelSpec,
    cost_model,
    decode_step_time,
    efficiency_for,
    get_gpu,
    replay,
    simulate_replica,
)
from llmfabric.sim.calibration import CALIBRATED, l2_hit_fraction, warm_read_factor
from llmfabric.sim.costs import (
    attention_time,
    build_cost_model,
    decode_extra_waves,
    memory_bandwidth,
    op_time,
)
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import gpu_from_mapping
from llmfabric.sim.operators import OpCost, attention_decode_ops
from llmfabric.sim.parallel import make_deployment


@pytest.fixture
def sm_gpu(unit_gpu: GPUSpec) -> GPUSpec:
    """The unit GPU with 10 SMs and a 1 MB L2."""
    return dataclasses.replace(unit_gpu, sm_count=10, l2_bytes=1e6)


def test_extra_waves_hand_computed(sm_gpu: GPUSpec) -> None:
    assert decode_extra_waves(sm_gpu, 5, 2) == 0  # 10 blocks: one wave
    assert decode_extra_waves(sm_gpu, 6, 2) == 1  # 12 blocks: two waves
    assert decode_extra_waves(sm_gpu, 25, 2) == 4  # 50 blocks: five waves
    assert decode_extra_waves(sm_gpu, 0, 2) == 0
    assert decode_extra_waves(dataclasses.replace(sm_gpu, sm_count=0), 1000, 8) == 0
    h100 = get_gpu("H100-SXM")  # 132 SMs
    assert decode_extra_waves(h100, 16, 8) == 0  # 128 blocks
    assert decode_extra_waves(h100, 17, 8) == 1  # 136 blocks
    assert decode_extra_waves(h100, 64, 8) == 3  # 512 blocks: ceil(3.88) = 4 waves


def test_attention_time_adds_one_wave_cost_per_extra_wave(
        tiny: ModelSpec, sm_gpu: GPUSpec, ideal: Efficiency) -> None:
    eff = dataclasses.replace(ideal, decode_wave_s=2e-6)
    ops = attention_decode_ops(tiny, 1, batch=4, total_context=400)
    base = attention_time(ops, sm_gpu, eff)
    assert attention_time(ops, sm_gpu, eff, extra_waves=3) == pytest.approx(base + 6e-6)


def test_non_split_block_streams_once_per_wave(tiny: ModelSpec, sm_gpu: GPUSpec,
                                               ideal: Efficiency) -> None:
    ops = (OpCost("attn", 0.0, 1.0),)  # negligible bandwidth time
    eff = dataclasses.replace(ideal, decode_cta_bw=1e10)
    one = attention_time(ops, sm_gpu, eff, serial_bytes=1e5)
    assert one == pytest.approx(1e5 / 1e10)  # 10 us: one block's K/V
    assert attention_time(ops, sm_gpu, eff, serial_bytes=1e5, extra_waves=2) == pytest.approx(
        3e5 / 1e10)


def test_memory_bandwidth_warm_only_when_the_working_set_fits(sm_gpu: GPUSpec,
                                                              ideal: Efficiency) -> None:
    eff = dataclasses.replace(ideal, memory=0.5, l2_speedup=2.0)
    assert memory_bandwidth(sm_gpu, eff) == 0.5e9  # serving: always HBM
    assert memory_bandwidth(sm_gpu, eff, 1e6, warm_l2=False) == 0.5e9
    assert memory_bandwidth(sm_gpu, eff, 1e6, warm_l2=True) == 1e9  # fits: 2x
    assert memory_bandwidth(sm_gpu, eff, 1e6 + 1, warm_l2=True) == 0.5e9  # does not fit
    op = OpCost("gemv", 0.0, 5e5)
    assert op_time(op, sm_gpu, eff, warm_l2=True) == pytest.approx(5e5 / 1e9)
    assert op_time(op, sm_gpu, eff, warm_l2=True, working_set=2e6) == pytest.approx(5e5 / 0.5e9)
    dec = attention_decode_ops(ModelSpec("m", 1, 64, 4, 4, 16, 128, 100), 1, 1, 100.0)
    cold = attention_time(dec, sm_gpu, eff)
    assert attention_time(dec, sm_gpu, eff, warm_l2=True) == pytest.approx(cold / 2)


def test_step_cost_model_wave_table(tiny: ModelSpec, sm_gpu: GPUSpec,
                                    ideal: Efficiency) -> None:
    eff = dataclasses.replace(ideal, decode_wave_s=1e-6)
    cm = build_cost_model(make_deployment(tiny, sm_gpu, 1, 1), eff, table_tokens=64)
    # tiny: 2 layers, 2 KV heads per GPU; 10 SMs -> one extra wave from 6 sequences on
    assert cm.decode_wave_time(5) == 0.0
    assert cm.decode_wave_time(6) == pytest.approx(2 * 1e-6)
    assert cm.decode_wave_time(25) == pytest.approx(2 * 4e-6)
    assert cm.decode_wave_time(10**5) == pytest.approx(2 * (2 * 10**5 // 10 - 1) * 1e-6)
    step = cm.decode_step_time(6, 600.0) - cm.decode_step_time(5, 500.0)
    lin = cm.linear_time(6) - cm.linear_time(5) + cm.head_time(6) - cm.head_time(5)
    expected = (lin + cm.decode_per_sequence + 2e-6
                + cm.decode_context_coeff(6) * 600 - cm.decode_context_coeff(5) * 500)
    assert step == pytest.approx(expected)
    off = build_cost_model(make_deployment(tiny, sm_gpu, 1, 1), ideal, table_tokens=64)
    assert off.decode_wave_time(25) == 0.0


def test_engine_stretch_includes_waves_in_closed_form() -> None:
    """A static batch decoded by the engine's closed-form stretch equals the sum of per-step
    costs, with a batch that needs an extra wave (llama-2-7b: 32 KV heads, 5 x 32 > 132)."""
    batch, prompt, out = 5, 200, 40
    res = simulate_replica("llama-2-7b", "H100-SXM", 1,
                           replay([(0.0, prompt, out)] * batch))
    cm = cost_model("llama-2-7b", "H100-SXM", 1)
    assert cm.decode_wave_time(batch) > 0
    expected = cm.prefill_time([prompt] * batch) + sum(
        cm.decode_step_time(batch, batch * (prompt + j)) for j in range(out - 1))
    assert float(res.e2e_s.max()) == pytest.approx(expected, rel=1e-9)


def test_shipped_rows() -> None:
    h100, a100 = CALIBRATED["H100-SXM"], CALIBRATED["A100-80GB"]
    assert h100.l2_speedup > 1 and h100.decode_wave_s > 0
    assert a100.l2_speedup == 1.0 and a100.decode_wave_s == 0.0  # did not help its holdout
    assert a100.nosplit_overhead_s() < a100.attention_overhead_s  # no combine kernel
    assert h100.decode_nosplit_overhead_s is None  # FlashAttention-3 always splits
    # cache "MB" are 2^20 bytes: CUDA reports 52,428,800 (H100) and 41,943,040 (A100)
    assert get_gpu("H100-SXM").l2_bytes == 52_428_800 and get_gpu("H100-SXM").sm_count == 132
    assert get_gpu("A100").l2_bytes == 41_943_040 and get_gpu("A100").sm_count == 108
    assert 0 < h100.l2_usable_fraction < 1 and h100.l2_sharpness > 0  # smooth residency


def test_validation_and_yaml_keys() -> None:
    with pytest.raises(SpecError, match="l2_speedup"):
        Efficiency(l2_speedup=0.5)
    with pytest.raises(SpecError, match="decode_wave_s"):
        Efficiency(decode_wave_s=-1e-6)
    g = gpu_from_mapping("x", {"l2_mb": 24, "sm_count": 58}, base=get_gpu("L40S"))
    assert g.l2_bytes == 24 * 2**20 and g.sm_count == 58 and isinstance(g.sm_count, int)
    assert gpu_from_mapping("y", {"l2_mib": 6}, base=g).l2_bytes == 6 * 2**20
    with pytest.raises(SpecError, match="l2_usable_fraction"):
        Efficiency(l2_usable_fraction=0.0)
    with pytest.raises(SpecError, match="l2_sharpness"):
        Efficiency(l2_sharpness=-1.0)


def test_smooth_l2_residency_by_hand(sm_gpu: GPUSpec, ideal: Efficiency) -> None:
    """h(W) = 1 / (1 + (W / C)^k), C = fraction x L2 (1 MB here); the resident share is read
    l2_speedup times faster: memory time x (1 - h (1 - 1/s))."""
    eff = dataclasses.replace(ideal, l2_speedup=2.0, l2_usable_fraction=0.5, l2_sharpness=4.0)
    assert l2_hit_fraction(5e5, sm_gpu.l2_bytes, eff) == pytest.approx(0.5)  # W = C
    assert l2_hit_fraction(1e6, sm_gpu.l2_bytes, eff) == pytest.approx(1 / 17)  # (W/C)^4 = 16
    assert l2_hit_fraction(2.5e5, sm_gpu.l2_bytes, eff) == pytest.approx(16 / 17)
    assert l2_hit_fraction(0.0, sm_gpu.l2_bytes, eff) == 0.0
    assert warm_read_factor(5e5, sm_gpu.l2_bytes, eff) == pytest.approx(0.75)
    assert memory_bandwidth(sm_gpu, eff, 5e5, warm_l2=True) == pytest.approx(1e9 / 0.75)
    assert memory_bandwidth(sm_gpu, eff, 5e5, warm_l2=False) == 1e9  # serving: cold
    hard = dataclasses.replace(eff, l2_sharpness=0.0)  # threshold at C
    assert l2_hit_fraction(5e5, sm_gpu.l2_bytes, hard) == 1.0
    assert l2_hit_fraction(5e5 + 1, sm_gpu.l2_bytes, hard) == 0.0
    ws = np.array([1e5, 4e5, 6e5, 2e6])
    np.testing.assert_allclose(l2_hit_fraction(ws, sm_gpu.l2_bytes, eff),
                               [1 / (1 + (w / 5e5) ** 4) for w in ws])


@settings(max_examples=60, deadline=None)
@given(a=st.floats(1.0, 1e9), b=st.floats(1.0, 1e9), frac=st.floats(0.05, 1.0),
       k=st.floats(0.0, 32.0))
def test_residency_never_grows_with_the_working_set(a: float, b: float, frac: float,
                                                    k: float) -> None:
    eff = Efficiency(l2_speedup=2.0, l2_usable_fraction=frac, l2_sharpness=k)
    small, large = min(a, b), max(a, b)
    assert l2_hit_fraction(large, 5e7, eff) <= l2_hit_fraction(small, 5e7, eff) + 1e-12


GPUS = ["A100-80GB", "H100-SXM", "L40S", "RTX-4090", "MI300X", "V100"]


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 300), ctx=st.integers(0, 8000), more=st.integers(0, 200),
       gpu=st.sampled_from(GPUS))
def test_more_sms_never_slow_decode(batch: int, ctx: int, more: int, gpu: str) -> None:
    base = get_gpu(gpu)
    bigger = dataclasses.replace(base, name=base.name + "-big", sm_count=base.sm_count + more)
    eff = dataclasses.replace(efficiency_for(base), decode_wave_s=3e-6)
    t0 = decode_step_time("llama-2-7b", base, 1, batch, ctx, efficiency=eff)
    t1 = decode_step_time("llama-2-7b", bigger, 1, batch, ctx, efficiency=eff)
    assert t1 <= t0 + 1e-15


@settings(max_examples=40, deadline=None)
@given(n_bytes=st.floats(1.0, 1e9), speedup=st.floats(1.0, 4.0), gpu=st.sampled_from(GPUS))
def test_a_warm_read_is_never_slower_than_a_cold_one(n_bytes: float, speedup: float,
                                                     gpu: str) -> None:
    g = get_gpu(gpu)
    eff = dataclasses.replace(efficiency_for(g), l2_speedup=speedup)
    op = OpCost("x", 1e6, n_bytes)
    assert op_time(op, g, eff, warm_l2=True) <= op_time(op, g, eff) + 1e-15


def test_non_split_kernel_has_its_own_fixed_latency(tiny: ModelSpec, sm_gpu: GPUSpec,
                                                     ideal: Efficiency) -> None:
    ops = (OpCost("attn", 0.0, 1.0),)
    eff = dataclasses.replace(ideal, attention_overhead_s=17e-6, decode_cta_bw=1e10,
                              decode_nosplit_overhead_s=8e-6)
    assert eff.nosplit_overhead_s() == 8e-6
    assert dataclasses.replace(eff, decode_nosplit_overhead_s=None).nosplit_overhead_s() == 17e-6
    # non-split (serial bytes, block bandwidth on): the single kernel's 8 us
    assert attention_time(ops, sm_gpu, eff, serial_bytes=1e5) == pytest.approx(10e-6 + 8e-6)
    # split (no serial bytes): kernel + combine, the 17 us attention overhead
    assert attention_time(ops, sm_gpu, eff) == pytest.approx(1.0 / 1e9 + 17e-6)
    with pytest.raises(SpecError, match="decode_nosplit_overhead_s"):
        Efficiency(decode_nosplit_overhead_s=-1e-6)


def test_step_costs_use_the_non_split_latency_for_decode_only(
        tiny: ModelSpec, sm_gpu: GPUSpec, ideal: Efficiency) -> None:
    mha = dataclasses.replace(tiny, name="tiny-mha", n_kv_heads=tiny.n_heads)
    eff = dataclasses.replace(ideal, attention_overhead_s=17e-6, decode_cta_bw=1e10,
                              decode_nosplit_overhead_s=8e-6)
    cm = build_cost_model(make_deployment(mha, sm_gpu, 1, 1), eff, table_tokens=64)
    assert cm.decode_overhead_adjust_s == pytest.approx(2 * (8e-6 - 17e-6))  # 2 layers
    ref = build_cost_model(make_deployment(mha, sm_gpu, 1, 1),
                           dataclasses.replace(eff, decode_nosplit_overhead_s=None),
                           table_tokens=64)
    assert ref.decode_overhead_adjust_s == 0.0
    assert cm.decode_step_time(3, 300.0) == pytest.approx(
        ref.decode_step_time(3, 300.0) - 18e-6)
    # decode-only chunked step: the same; with a prefill chunk: the varlen kernel's overhead
    assert cm.mixed_step_time(3, 300.0, [], 0) == pytest.approx(cm.decode_step_time(3, 300.0))
    assert cm.mixed_step_time(3, 300.0, [(8, 0)], 1) == pytest.approx(
        ref.mixed_step_time(3, 300.0, [(8, 0)], 1))
    gqa = build_cost_model(make_deployment(tiny, sm_gpu, 1, 1), eff, table_tokens=64)
    assert gqa.decode_overhead_adjust_s == 0.0  # grouped queries: the kernel splits


def test_engine_stretch_on_a_non_split_gpu() -> None:
    """A100 (non-split multi-head decode for llama-2-7b): the closed-form stretch still equals
    the per-step sum with the non-split latency and the per-wave streaming."""
    batch, prompt, out = 5, 300, 30
    res = simulate_replica("llama-2-7b", "A100", 1, replay([(0.0, prompt, out)] * batch))
    cm = cost_model("llama-2-7b", "A100", 1)
    assert cm.decode_overhead_adjust_s < 0
    expected = cm.prefill_time([prompt] * batch) + sum(
        cm.decode_step_time(batch, batch * (prompt + j)) for j in range(out - 1))
    assert float(res.e2e_s.max()) == pytest.approx(expected, rel=1e-9)
