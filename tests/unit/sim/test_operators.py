"""Hand-computed FLOPs and bytes for a tiny config, and roofline timing."""

from __future__ import annotations

import pytest

from llmfabric.sim import Efficiency, GPUSpec, ModelSpec
from llmfabric.sim.costs import attention_time, build_cost_model, op_time
from llmfabric.sim.operators import (
    OpCost,
    attention_decode_ops,
    attention_prefill_ops,
    layer_linear_ops,
    lm_head_op,
)
from llmfabric.sim.parallel import make_deployment


def _ops(model: ModelSpec, tp: int, m: int) -> dict[str, OpCost]:
    return {op.name: op.cost(m) for op in layer_linear_ops(model, tp)}


def test_linear_ops_hand_computed(tiny: ModelSpec) -> None:
    ops = _ops(tiny, 1, 10)
    # fused QKV: 2*m*h*(q_dim + 2*kv_dim); bytes: weights h*(q+2kv)*2 + activations m*(h+q+2kv)*2
    qkv = 64 + 2 * 32
    assert ops["qkv_proj"] == OpCost("qkv_proj", 2 * 10 * 64 * qkv,
                                     64 * qkv * 2 + 10 * (64 + qkv) * 2)
    assert ops["rope"].flops == 3 * 10 * (64 + 32) and not ops["rope"].tensor
    assert ops["o_proj"].flops == 2 * 10 * 64 * 64
    assert ops["mlp_gate_up"].flops == 2 * 10 * 64 * 128 * 2
    assert ops["mlp_gate_up"].bytes == 64 * 128 * 2 * 2 + 10 * (64 + 256) * 2
    assert ops["mlp_down"].flops == 2 * 10 * 128 * 64
    assert ops["mlp_down"].bytes == 128 * 64 * 2 + 10 * (128 + 64) * 2
    assert not ops["input_norm"].tensor and not ops["mlp_act"].tensor


def test_tensor_parallel_shards_matmuls(tiny: ModelSpec) -> None:
    one, two = _ops(tiny, 1, 10), _ops(tiny, 2, 10)
    for name in ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"):
        assert two[name].flops == one[name].flops / 2
    assert two["input_norm"] == one["input_norm"]  # replicated


def test_attention_hand_computed(tiny: ModelSpec) -> None:
    score, softmax, value = attention_prefill_ops(tiny, 1, chunk=10, prefix=0)
    pairs = 10 * 5.5  # token i sees i + 1 keys
    assert score.flops == 2 * 4 * 16 * pairs
    assert score.bytes == 10 * 4 * 16 * 2 + 10 * 2 * 16 * 2
    assert softmax.flops == 5 * 4 * pairs and softmax.bytes == 0
    assert value.flops == score.flops
    d_score, _, _ = attention_decode_ops(tiny, 1, batch=2, total_context=100)
    assert d_score.flops == 2 * 4 * 16 * 100
    assert d_score.bytes == 2 * 4 * 16 * 2 + 100 * 2 * 16 * 2


def test_lm_head_hand_computed(tiny: ModelSpec) -> None:
    op = lm_head_op(tiny).cost(1)
    assert op.flops == 2 * 64 * 100 + 4 * 64
    assert op.bytes == 64 * 100 * 2 + 64 * 2 + (64 + 100) * 2 + 4 * 100


def test_roofline_is_max_of_compute_and_memory(unit_gpu: GPUSpec, ideal: Efficiency) -> None:
    assert op_time(OpCost("c", 2e12, 1e3), unit_gpu, ideal) == pytest.approx(2.0)
    assert op_time(OpCost("m", 1e3, 3e9), unit_gpu, ideal) == pytest.approx(3.0)
    assert op_time(OpCost("v", 1e11, 0, tensor=False), unit_gpu, ideal) == pytest.approx(1.0)
    slow = Efficiency(compute=0.5, memory=0.5, kernel_overhead_s=0.25, step_overhead_s=0)
    assert op_time(OpCost("m", 1e3, 3e9), unit_gpu, slow) == pytest.approx(6.25)
    smooth = Efficiency(compute=1.0, memory=1.0, kernel_overhead_s=0.0, roofline_p=2.0)
    assert op_time(OpCost("x", 3e12, 4e9), unit_gpu, smooth) == pytest.approx(5.0)


def test_fused_attention_time(unit_gpu: GPUSpec, ideal: Efficiency) -> None:
    ops = (OpCost("s", 1e12, 1e9), OpCost("softmax", 5e11, 0, tensor=False),
           OpCost("v", 1e12, 2e9))
    assert attention_time(ops, unit_gpu, ideal) == pytest.approx(3.0)  # bytes dominate
    half = Efficiency(attention=0.5, memory=1.0, attention_overhead_s=0.5)
    assert attention_time(ops, unit_gpu, half) == pytest.approx(4.5)  # 2e12 / 0.5e12 + 0.5


def test_cost_model_decode_matches_operator_sum(tiny: ModelSpec, unit_gpu: GPUSpec,
                                                ideal: Efficiency) -> None:
    cm = build_cost_model(make_deployment(tiny, unit_gpu), ideal, table_tokens=64)
    batch, ctx = 4, 400.0
    expected = 0.0
    for op in layer_linear_ops(tiny):
        expected += tiny.n_layers * op_time(op.cost(batch), unit_gpu, ideal)
    expected += tiny.n_layers * attention_time(attention_decode_ops(tiny, 1, batch, ctx),
                                               unit_gpu, ideal)
    expected += op_time(lm_head_op(tiny).cost(batch), unit_gpu, ideal)
    expected += 2 * 64 * 2 * batch / 1e9  # embedding activations
    assert cm.decode_step_time(batch, ctx) == pytest.approx(expected, rel=1e-9)


def test_cost_model_prefill_matches_operator_sum(tiny: ModelSpec, unit_gpu: GPUSpec,
                                                 ideal: Efficiency) -> None:
    cm = build_cost_model(make_deployment(tiny, unit_gpu), ideal, table_tokens=64)
    n = 32
    expected = 0.0
    for op in layer_linear_ops(tiny):
        expected += tiny.n_layers * op_time(op.cost(n), unit_gpu, ideal)
    expected += tiny.n_layers * attention_time(attention_prefill_ops(tiny, 1, n, 0), unit_gpu,
                                               ideal)
    expected += op_time(lm_head_op(tiny).cost(1), unit_gpu, ideal)
    expected += 2 * 64 * 2 * n / 1e9
    assert cm.prefill_time([n]) == pytest.approx(expected, rel=1e-9)
    # beyond the table the same formula is used
    assert cm.linear_time(100) > cm.linear_time(64)


def test_moe_touches_fewer_expert_weights_for_few_tokens() -> None:
    from llmfabric.sim import get_model

    mixtral = get_model("mixtral-8x7b")
    up = next(op for op in layer_linear_ops(mixtral) if op.name == "mlp_gate_up")
    one = up.cost(1)
    many = up.cost(4096)
    assert one.flops == 2 * 4096 * 14336 * 2 * 2  # top-2 experts
    assert one.bytes < many.bytes
    assert up.weights_touched(4096.0) == pytest.approx(8 * 4096 * 14336 * 2 * 2, rel=0.01)
