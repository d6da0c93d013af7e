"""`sim.e2e_correction`: the optional residual layer on the e2e replay (hand-computed cases,
recovery of a known log-linear bias, fallbacks, leave-one-group-out, and `replay(correction=)`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import SpecError, e2e
from llmfabric.sim.e2e_correction import (
    POOLED,
    ResidualCorrection,
    features,
    fit_correction,
    leave_one_group_out,
    mape,
    ridge_fit,
)

pytestmark = pytest.mark.unit


def _rec(
    backend: str,
    c: int,
    isl: int,
    osl: int,
    tp: int,
    ttft: float,
    tpot: float,
    pred_ttft: float,
    pred_tpot: float,
    **kw: object,
) -> dict[str, object]:
    return {
        "backend": backend,
        "concurrency": c,
        "isl": isl,
        "osl": osl,
        "tp": tp,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "pred_ttft_ms": pred_ttft,
        "pred_tpot_ms": pred_tpot,
        **kw,
    }


def test_features_by_hand_and_hostile_input() -> None:
    x = features(4, 1024, 128, 2)
    assert x.tolist() == pytest.approx(
        [1.0, math.log(4), math.log(1024), math.log(128), math.log(2)]
    )
    with pytest.raises(SpecError, match="concurrency"):
        features(0, 1024, 128, 1)
    with pytest.raises(SpecError, match="ridge"):
        ridge_fit(np.ones((3, 1)), np.ones(3), -1.0)
    with pytest.raises(SpecError, match="min_rows"):
        fit_correction([], min_rows=2)


def test_ridge_fit_by_hand() -> None:
    # x = [[1, 0], [1, 1]], y = [1, 3]: exact fit w = (1, 2); with ridge 1 on the slope only:
    # normal equations [[2, 1], [1, 2]] w = [4, 3] -> w = (5/3, 2/3)
    x = np.array([[1.0, 0.0], [1.0, 1.0]])
    y = np.array([1.0, 3.0])
    assert ridge_fit(x, y, 0.0).tolist() == pytest.approx([1.0, 2.0])
    assert ridge_fit(x, y, 1.0).tolist() == pytest.approx([5 / 3, 2 / 3])


def test_constant_bias_is_removed_exactly() -> None:
    # every measurement is 2x the prediction (TTFT) and 0.5x (TPOT): the fit is the intercept
    # ln 2 / -ln 2 with zero slopes, and the corrected predictions equal the measurements
    recs = [
        _rec("vllm", c, isl, osl, tp, 200.0, 5.0, 100.0, 10.0)
        for c in (1, 4, 16, 64)
        for isl in (512, 1024, 4096)
        for osl in (128, 1024)
        for tp in (1, 2)
    ]
    corr = fit_correction(recs, ridge=0.0, min_rows=5)
    w = corr.weights["vllm"]
    assert list(w["ttft"]) == pytest.approx([math.log(2), 0, 0, 0, 0], abs=1e-6)
    assert list(w["tpot"]) == pytest.approx([-math.log(2), 0, 0, 0, 0], abs=1e-6)
    out = corr.apply(recs)
    assert all(r["pred_ttft_ms"] == pytest.approx(200.0) for r in out)
    assert all(r["pred_tpot_ms"] == pytest.approx(5.0) for r in out)
    assert out[0]["analytic_ttft_ms"] == 100.0 and recs[0]["pred_ttft_ms"] == 100.0
    assert mape(out)["ttft_mape"] == pytest.approx(0.0, abs=1e-9)
    assert mape(recs) == {
        "n": len(recs),
        "ttft_mape": pytest.approx(50.0),
        "tpot_mape": pytest.approx(100.0),
    }


@settings(max_examples=25, deadline=None)
@given(a=st.floats(-1, 1), b=st.floats(-0.5, 0.5), d=st.floats(-0.5, 0.5))
def test_known_log_linear_bias_is_recovered(a: float, b: float, d: float) -> None:
    # measured = pred * c^b * tp^d * e^a exactly: ridge 0 recovers (a, b, 0, 0, d)
    recs = []
    for c in (1, 2, 8, 32, 128):
        for isl, osl in ((1024, 128), (4096, 1024), (8192, 512)):
            for tp in (1, 2, 4):
                f = math.exp(a) * c**b * tp**d
                recs.append(_rec("trtllm", c, isl, osl, tp, 50.0 * f, 10.0, 50.0, 10.0))
    w = fit_correction(recs, ridge=0.0).weights["trtllm"]["ttft"]
    assert list(w) == pytest.approx([a, b, 0.0, 0.0, d], abs=1e-6)


def test_fallbacks_pooled_and_identity() -> None:
    recs = [_rec("vllm", c, 1024, 128, 1, 150.0, 10.0, 100.0, 10.0) for c in range(1, 31)]
    recs += [_rec("sglang", c, 1024, 128, 1, 150.0, 10.0, 100.0, 10.0) for c in range(1, 4)]
    corr = fit_correction(recs, min_rows=20)
    assert set(corr.weights) == {POOLED, "vllm"}  # sglang: 3 rows, too few
    assert corr.n_rows == {POOLED: 33, "vllm": 30}
    ft, fp = corr.factors("trtllm", 8, 1024, 128, 1)  # unseen backend: pooled fit
    assert ft == pytest.approx(1.5, rel=1e-3) and fp == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(SpecError, match="5 finite numbers"):
        ResidualCorrection({"vllm": {"ttft": (0.0, 1.0), "tpot": (0.0,) * 5}})
    with pytest.raises(SpecError, match="tpot"):
        ResidualCorrection({"vllm": {"ttft": (0.0,) * 5}})
    empty = ResidualCorrection()
    assert empty.factors("vllm", 8, 1024, 128, 1) == (1.0, 1.0)
    assert fit_correction(recs[:3]).weights == {}


def test_unusable_rows_are_skipped_and_copied() -> None:
    good = [_rec("vllm", c, 1024, 128, 1, 150.0, 10.0, 100.0, 10.0) for c in range(1, 25)]
    bad = _rec("vllm", 4, 1024, 128, 1, 150.0, 10.0, math.nan, math.nan, error="unknown GPU")
    corr = fit_correction([*good, bad])
    assert corr.n_rows["vllm"] == 24
    (copied,) = corr.apply([bad])
    assert copied == bad and "analytic_ttft_ms" not in copied


def test_leave_one_group_out_fits_on_the_other_groups_only() -> None:
    # GPU a: measured = 2 x predicted; GPU b: measured = predicted. Holding out b, the fit
    # (on a) doubles b's predictions: calibrated APE 100 % where analytic is 0
    recs = [
        _rec("vllm", c, 1024, 128, 1, 2.0 * 100, 10.0, 100.0, 10.0, gpu="a") for c in range(1, 25)
    ]
    recs += [_rec("vllm", c, 1024, 128, 1, 100.0, 10.0, 100.0, 10.0, gpu="b") for c in range(1, 25)]
    out = leave_one_group_out(recs, "gpu", ridge=0.0)
    assert out["b"]["analytic"]["ttft_mape"] == pytest.approx(0.0)
    assert out["b"]["calibrated"]["ttft_mape"] == pytest.approx(100.0)
    assert out["a"]["calibrated"]["ttft_mape"] == pytest.approx(50.0)
    assert out["a"]["fitted_on"] == 24


def test_replay_applies_a_correction() -> None:
    row = e2e.E2ERow(
        "meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", "vllm", "", "", "", 1, 256, 16, 2, 50.0, 8.0
    )
    plain = e2e.replay([row], waves=2, runs=1)["rows"][0]
    weights = {
        "vllm": {
            "ttft": (math.log(2.0), 0.0, 0.0, 0.0, 0.0),
            "tpot": (math.log(0.5), 0.0, 0.0, 0.0, 0.0),
        }
    }
    got = e2e.replay([row], waves=2, runs=1, correction=ResidualCorrection(weights))["rows"][0]
    assert got["pred_ttft_ms"] == pytest.approx(2.0 * plain["pred_ttft_ms"])
    assert got["pred_tpot_ms"] == pytest.approx(0.5 * plain["pred_tpot_ms"])
    assert got["analytic_ttft_ms"] == plain["pred_ttft_ms"]
