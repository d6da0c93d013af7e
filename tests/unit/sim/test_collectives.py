"""TP all-reduce cost: the alpha-beta formula by hand, vLLM's custom/NCCL dispatch, the
fitted rows against a few measured points, and how the step cost model uses it."""

from __future__ import annotations

import numpy as np
import pytest

from llmfabric.sim import Deployment, Link, SpecError, allreduce_time, get_gpu, get_model
from llmfabric.sim.collectives import (
    CUSTOM_MAX_BYTES,
    AllReduceModel,
    AllReduceRegime,
    allreduce_model,
    fitted_allreduce,
    ring_model,
    scaled_regime,
)
from llmfabric.sim.costs import build_cost_model
from llmfabric.sim.operators import tp_allreduce_bytes_per_token
from llmfabric.sim.parallel import make_deployment


def test_alpha_beta_formula_by_hand() -> None:
    r = AllReduceRegime(base_s=4e-6, per_rank_s=1e-6, bus_bw=200e9)
    # 4 us + 3 ranks x 1 us + 2*3/4 x 1 MB / 200 GB/s = 7 us + 7.5 us
    assert r.time(1e6, 4) == pytest.approx(14.5e-6)
    assert r.time(0.0, 2) == pytest.approx(5e-6)
    assert r.time(1e6, 1) == 0.0  # one rank: nothing to reduce
    # ring over a link = HeroServe eq. 11: 2(n-1) alpha + 2(n-1)/n bytes/beta
    ring = ring_model(100e9, 2e-6)
    assert ring.time(1e6, 8) == pytest.approx(2 * 7 * 2e-6 + 1.75 * 1e6 / 100e9)  # 45.5 us
    assert ring.time(1e6, 8) == pytest.approx(allreduce_time(1e6, 8, Link(100e9, 2e-6)))
    with pytest.raises(SpecError):
        AllReduceRegime(0.0, 0.0, 0.0)


def test_custom_regime_below_8_mib_on_supported_world_sizes() -> None:
    model = AllReduceModel(nccl=AllReduceRegime(10e-6, 2e-6, 100e9),
                           custom=AllReduceRegime(5e-6, 0.0, 100e9))
    small = CUSTOM_MAX_BYTES - 2.0
    assert model.time(small, 4) == pytest.approx(5e-6 + 1.5 * small / 100e9)
    assert model.time(CUSTOM_MAX_BYTES, 4) == pytest.approx(
        10e-6 + 3 * 2e-6 + 1.5 * CUSTOM_MAX_BYTES / 100e9)
    assert model.time(small, 3) == pytest.approx(10e-6 + 2 * 2e-6 + 4 / 3 * small / 100e9)
    np.testing.assert_allclose(model.times(np.array([0.0, small]), 4),
                               [5e-6, model.time(small, 4)])


def test_fitted_rows_match_measured_small_messages() -> None:
    """aiconfigurator (vLLM custom all-reduce, CUDA graphs, 256 BF16 elements): H100 4.2 /
    4.5 / 4.7 us and A100 4.9 / 5.2 / 5.7 us at 2 / 4 / 8 GPUs. The ring formula over NVLink
    (2 us per hop) said 4 / 12 / 28 us."""
    for gpu, measured in (("H100-SXM", (4.2, 4.5, 4.7)), ("A100-80GB", (4.9, 5.2, 5.7))):
        model = allreduce_model(get_gpu(gpu))
        for n, us in zip((2, 4, 8), measured, strict=True):
            assert model.time(512.0, n) * 1e6 == pytest.approx(us, rel=0.25)
    h100 = get_gpu("H100-SXM")
    ring = ring_model(h100.intra_node_bw, h100.intra_node_latency_s)
    assert ring.time(512.0, 8) * 1e6 == pytest.approx(28.0, rel=0.01)


def test_siblings_and_unmeasured_gpus() -> None:
    assert fitted_allreduce(get_gpu("H200")) is fitted_allreduce(get_gpu("H100-SXM"))
    assert fitted_allreduce(get_gpu("A100-40GB")) is fitted_allreduce(get_gpu("A100-80GB"))
    assert fitted_allreduce(get_gpu("L40S")) is None
    l40s = get_gpu("L40S")
    assert allreduce_model(l40s) == ring_model(l40s.intra_node_bw, l40s.intra_node_latency_s)


def test_blackwell_borrows_hopper_fit_scaled_by_its_nvlink_bandwidth() -> None:
    h100, b200 = fitted_allreduce(get_gpu("H100-SXM")), fitted_allreduce(get_gpu("B200"))
    assert h100 is not None and b200 is not None and b200.custom is not None
    assert h100.custom is not None
    ratio = get_gpu("B200").intra_node_bw / get_gpu("H100-SXM").intra_node_bw
    assert ratio == 2.0  # NVLink 5 (900 GB/s per direction) vs NVLink 4 (450)
    assert b200.nccl == AllReduceRegime(h100.nccl.base_s, h100.nccl.per_rank_s,
                                        h100.nccl.bus_bw * 2)
    assert b200.custom.bus_bw == h100.custom.bus_bw * 2
    # big messages: ~half the time; tiny ones: the same latency
    big, tiny = 128e6, 1.0
    latency = h100.nccl.base_s + 7 * h100.nccl.per_rank_s
    assert b200.time(big, 8) - latency == pytest.approx((h100.time(big, 8) - latency) / 2)
    assert b200.time(tiny, 8) == pytest.approx(h100.time(tiny, 8), rel=0.01)
    assert fitted_allreduce(get_gpu("GB200")) == b200


def test_scaled_regime_keeps_latency_and_rejects_bad_ratios() -> None:
    r = AllReduceRegime(5e-6, 1e-6, 100e9)
    assert scaled_regime(r, 3.0) == AllReduceRegime(5e-6, 1e-6, 300e9)
    with pytest.raises(SpecError):
        scaled_regime(r, 0.0)


def test_cost_model_uses_the_fitted_model_unless_a_tp_link_is_given() -> None:
    model = get_model("llama-2-7b")
    dep = make_deployment(model, "H100-SXM", 8)
    fitted = build_cost_model(dep, table_tokens=64)
    link = Link(450e9, 2e-6)
    ring = build_cost_model(Deployment(model, dep.stages, tp_link=link), table_tokens=64)
    per_ar = tp_allreduce_bytes_per_token(model) / 2  # bytes per token per all-reduce
    for m in (1, 16, 64):
        expected = 2 * model.n_layers * (allreduce_time(per_ar * m, 8, link)
                                         - allreduce_model(get_gpu("H100")).time(per_ar * m, 8))
        assert ring.lin[m] - fitted.lin[m] == pytest.approx(expected, rel=1e-9)
