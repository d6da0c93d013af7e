"""Shape-aware low-precision GEMM efficiency (`calibration.ShapedLowPrecision`): hand-computed
shares and times, where the cost model uses it (FP8 layers' GEMMs only), and hostile input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmfabric.sim import SpecError, efficiency_for, get_gpu, get_model
from llmfabric.sim.calibration import ShapedLowPrecision
from llmfabric.sim.costs import _linear_times, cost_model, low_precision_gemm_time
from llmfabric.sim.operators import LinearOp, layer_linear_ops

pytestmark = pytest.mark.unit

SHAPED = ShapedLowPrecision(compute=0.5, k0=512.0, m0=64.0, n0=2048.0, tile_m=128)


def test_share_and_time_by_hand() -> None:
    # compute 1/2, k/(k+k0) = n/(n+n0) = 1/2; m padded to 0, 128, 128, 256 -> m/(m+m0) = 0,
    # 2/3, 2/3, 4/5; share = 1/8 x that
    m = np.array([0.0, 1.0, 128.0, 129.0])
    assert SHAPED.padded(m).tolist() == [0.0, 128.0, 128.0, 256.0]
    share = SHAPED.share(m, 2048, 512)
    assert share.tolist() == pytest.approx([0.0, 1 / 12, 1 / 12, 0.1])
    # time = flops per token x padded m / (peak x share): one row costs a whole tile
    t = low_precision_gemm_time(SHAPED, 2.0 * 2048 * 512, m, 2048, 512, 1e12)
    one_tile = 2.0 * 2048 * 512 * 128 / (1e12 / 12)
    assert t.tolist() == pytest.approx([0.0, one_tile, one_tile, 2.0 * 2048 * 512 * 256 / 1e11])


def test_hostile_parameters() -> None:
    with pytest.raises(SpecError):
        ShapedLowPrecision(compute=0.0, k0=1, m0=1, n0=1, tile_m=128)
    with pytest.raises(SpecError):
        ShapedLowPrecision(compute=0.5, k0=-1, m0=1, n0=1, tile_m=128)
    with pytest.raises(SpecError):
        ShapedLowPrecision(compute=0.5, k0=1, m0=1, n0=1, tile_m=0)


def test_layers_carry_their_gemm_shapes() -> None:
    model = get_model("llama-3.1-70b")
    ops = {op.name: op for op in layer_linear_ops(model, tp=4)}
    h, f = model.hidden, model.ffn_hidden // 4
    assert (ops["o_proj"].gemm_n, ops["o_proj"].gemm_k) == (h, model.q_dim // 4)
    assert (ops["mlp_gate_up"].gemm_n, ops["mlp_gate_up"].gemm_k) == (2 * f, h)
    assert (ops["mlp_down"].gemm_n, ops["mlp_down"].gemm_k) == (h, f)
    assert ops["input_norm"].gemm_k == 0  # not a GEMM


def test_only_low_precision_gemms_of_known_shape_use_it() -> None:
    gpu = get_gpu("H100")
    eff = efficiency_for(gpu)
    assert eff.low_precision_shaped is not None
    one = dataclasses.replace(eff, low_precision_shaped=None)
    m = np.array([8.0, 1024.0, 8192.0])
    gemm = LinearOp(
        "g", 2.0 * 7168 * 8192, 7168 * 8192.0, 8192 + 2 * 7168.0, gemm_n=7168, gemm_k=8192
    )
    shapeless = dataclasses.replace(gemm, gemm_n=0, gemm_k=0)
    # BF16: identical with and without the shape-aware model
    assert _linear_times((gemm,), m, gpu, eff, 16).tolist() == pytest.approx(
        _linear_times((gemm,), m, gpu, one, 16).tolist()
    )
    # FP8 without a known shape: the one factor
    assert _linear_times((shapeless,), m, gpu, eff, 8).tolist() == pytest.approx(
        _linear_times((gemm,), m, gpu, one, 8).tolist()
    )
    # FP8 of known shape: a large prefill GEMM is faster than with the one factor (the data:
    # 0.74 ms measured for m = 8192, n = 7168, k = 8192; the one factor gave 1.08 ms)
    shaped_t = _linear_times((gemm,), m, gpu, eff, 8)
    one_t = _linear_times((gemm,), m, gpu, one, 8)
    assert shaped_t[2] < 0.9 * one_t[2]
    # an FP8 70B prefill on H100 gets faster; a BF16 one does not change
    fp8 = get_model("llama-3.1-70b").with_quantization(weight_bits=8, kv_bits=8, gemm_bits=8)
    bf16 = get_model("llama-3.1-70b")
    assert cost_model(fp8, gpu, 2, efficiency=eff).prefill_time([8192]) < cost_model(
        fp8, gpu, 2, efficiency=one
    ).prefill_time([8192])
    assert cost_model(bf16, gpu, 2, efficiency=eff).prefill_time([8192]) == pytest.approx(
        cost_model(bf16, gpu, 2, efficiency=one).prefill_time([8192])
    )
