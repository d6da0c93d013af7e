"""Hand-computed FLOPs and bytes for a tiny config, and roofline timing."""

from __future__ import annotations

import pytest

from llmfabric.sim import Efficiency, GPUSpec, ModelSpec
from llmfabric.sim.costs import build_cost_model, op_time
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
    # q: 2*m*h*q_dim; bytes: weights h*q*2 + activations m*(h+q)*2
    assert ops["q_proj"] == OpCost("q_proj", 2 * 10 * 64 * 64, 64 * 64 * 2 + 10 * 128 * 2)
    assert ops["k_proj"].flops == 2 * 10 * 64 * 32
    assert ops["k_proj"].bytes == 64 * 32 * 2 + 10 * (64 + 32) * 2
    assert ops["v_proj"] == ops["k_proj"].__class__("v_proj", ops["k_proj"].flops,
                                                     ops["k_proj"].bytes)
    assert ops["o_proj"].flops == 2 * 10 * 64 * 64
    assert ops["mlp_gate_up"].flops == 2 * 10 * 64 * 128 * 2
    assert ops["mlp_gate_up"].bytes == 64 * 128 * 2 * 2 + 10 * (64 + 256) * 2
    assert ops["mlp_down"].flops == 2 * 10 * 128 * 64
    assert ops["mlp_down"].bytes == 128 * 64 * 2 + 10 * (128 + 64) * 2
    assert not ops["input_norm"].tensor and not ops["mlp_act"].tensor


def test_tensor_parallel_shards_matmuls(tiny: ModelSpec) -> None:
    one, two = _ops(tiny, 1, 10), _ops(tiny, 2, 10)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_gate_up", "mlp_down"):
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


def test_cost_model_decode_matches_operator_sum(tiny: ModelSpec, unit_gpu: GPUSpec,
                                                ideal: Efficiency) -> None:
    cm = build_cost_model(make_deployment(tiny, unit_gpu), ideal, table_tokens=64)
    batch, ctx = 4, 400.0
    expected = 0.0
    for op in layer_linear_ops(tiny):
        expected += tiny.n_layers * op_time(op.cost(batch), unit_gpu, ideal)
    for op in attention_decode_ops(tiny, 1, batch, ctx):
        expected += tiny.n_layers * op_time(op, unit_gpu, ideal)
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
    for op in attention_prefill_ops(tiny, 1, n, 0):
        expected += tiny.n_layers * op_time(op, unit_gpu, ideal)
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
