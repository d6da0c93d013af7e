"""Non-split multi-head decode attention (Efficiency.decode_cta_bw): hand-computed costs."""

from __future__ import annotations

import dataclasses

import pytest

from llmfabric.sim import Efficiency, GPUSpec, ModelSpec
from llmfabric.sim.calibration import CALIBRATED
from llmfabric.sim.costs import attention_time, build_cost_model, decode_serial_kv_bytes
from llmfabric.sim.errors import SpecError
from llmfabric.sim.operators import attention_decode_ops
from llmfabric.sim.parallel import make_deployment


@pytest.fixture
def mha(tiny: ModelSpec) -> ModelSpec:
    return dataclasses.replace(tiny, name="tiny-mha", n_kv_heads=tiny.n_heads)


def test_serial_bytes_only_for_multi_head_shards(tiny: ModelSpec, mha: ModelSpec) -> None:
    assert decode_serial_kv_bytes(tiny, 1) == 0.0  # 4 query heads share 2 KV heads: split
    assert decode_serial_kv_bytes(mha, 1) == 2 * 16 * 2  # K + V of one head, BF16
    assert decode_serial_kv_bytes(mha, 4) == 2 * 16 * 2  # one head per GPU is still MHA


def test_attention_time_is_bounded_by_one_block(mha: ModelSpec, unit_gpu: GPUSpec,
                                                ideal: Efficiency) -> None:
    ops = attention_decode_ops(mha, 1, batch=1, total_context=1000)
    plain = attention_time(ops, unit_gpu, ideal, serial_bytes=1000 * 64)
    assert plain == pytest.approx(sum(o.bytes for o in ops) / 1e9)  # cta limit off
    slow = dataclasses.replace(ideal, decode_cta_bw=1e7)  # one block streams 10 MB/s
    assert attention_time(ops, unit_gpu, slow, serial_bytes=1000 * 64) == pytest.approx(
        1000 * 64 / 1e7)
    assert attention_time(ops, unit_gpu, slow) == pytest.approx(plain)  # GQA: no serial bytes


def test_decode_context_coefficient_depends_on_batch_for_mha(
        tiny: ModelSpec, mha: ModelSpec, unit_gpu: GPUSpec, ideal: Efficiency) -> None:
    eff = dataclasses.replace(ideal, decode_cta_bw=1e7)
    cm = build_cost_model(make_deployment(mha, unit_gpu, 1, 1), eff, table_tokens=64)
    kv_tok = 2 * 4 * 16 * 2 / 1e9  # all heads' K/V of one cached token at 1 GB/s
    serial = 2 * 16 * 2 / 1e7  # one head's K/V through one block
    assert cm.decode_per_context_token == pytest.approx(2 * kv_tok)
    for b in (1, 2, 8, 100):
        assert cm.decode_context_coeff(b) == pytest.approx(2 * max(kv_tok, serial / b))
    assert cm.decode_context_coeff(10**6) == cm.decode_per_context_token
    step = cm.decode_step_time(2, 2 * 500.0) - cm.decode_step_time(2, 0.0)
    assert step == pytest.approx(1000 * 2 * serial / 2)
    gqa = build_cost_model(make_deployment(tiny, unit_gpu, 1, 1), eff, table_tokens=64)
    assert gqa.decode_context_coeff(1) == gqa.decode_per_context_token


def test_negative_block_bandwidth_is_rejected() -> None:
    with pytest.raises(SpecError, match="decode_cta_bw"):
        Efficiency(decode_cta_bw=-1.0)


def test_shipped_rows_split_on_hopper_only() -> None:
    assert CALIBRATED["H100-SXM"].decode_cta_bw == 0.0  # FlashAttention-3 splits the KV
    assert CALIBRATED["A100-80GB"].decode_cta_bw > 0
