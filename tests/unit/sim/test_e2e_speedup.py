"""End-to-end speedup validation (benchmarks/_sim_e2e.py): composition and speedup error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.sim import ModelSpec, efficiency_for, get_gpu
from llmfabric.testing.benchmark_module import load_benchmark
from llmfabric.testing.shared_data import require_data, shared_data

DATA = shared_data()
PROFILES = DATA / "operator-profiles"


E = load_benchmark("_sim_e2e")


def _synthetic() -> object:
    """LIN(m) = 1 + 0.5 m, ATTN_PREFILL(k, isl) = 0.25 k isl, ATTN_DECODE(b, keys) = 0.125 b
    keys."""
    return E.OpTables(lambda m: 1.0 + 0.5 * m,
                      lambda k, isl: 0.25 * k * isl,
                      lambda b, keys: 0.125 * b * keys)


def test_composition_matches_hand_computed_value() -> None:
    # input 3, output 4, batch 2, budget 4 tokens: two prefill steps of one prompt (LIN(3) +
    # ATTN(1, 3) each), then 3 decode steps of 2 tokens (LIN(2)) attending to 4, 5, 6 keys.
    cfg = E.Config(3, 4, 2)
    per_layer = 2 * (1 + 0.5 * 3) + 2 * 0.25 * 3 + 3 * (1 + 0.5 * 2) + 0.125 * 2 * (4 + 5 + 6)
    assert per_layer == 16.25
    assert E.compose(cfg, _synthetic(), n_layers=2, budget=4) == pytest.approx(2 * per_layer)
    # linear-only composition leaves both attention terms out
    linear_only = 2 * (2 * 2.5 + 3 * 2.0)
    assert E.compose(cfg, _synthetic(), 2, budget=4, attention=False) == pytest.approx(
        linear_only)


def test_single_token_output_is_prefill_only() -> None:
    assert E.compose(E.Config(8, 1, 1), _synthetic(), 1, budget=16) == pytest.approx(
        1 + 0.5 * 8 + 0.25 * 8)


def test_composition_from_an_interpolated_measured_grid() -> None:
    xs = np.array([1.0, 4.0])
    ys = np.array([1.5, 3.0])  # LIN(m) = 1 + 0.5 m on the grid points, linear in between
    tables = E.OpTables(lambda m: E.interp_strict(m, xs, ys, "lin"))
    assert E.compose(E.Config(3, 4, 2), tables, 2, budget=4, attention=False) == pytest.approx(
        2 * (2 * 2.5 + 3 * 2.0))
    with pytest.raises(E.MissingMeasurement):  # never extrapolated
        E.compose(E.Config(5, 2, 1), tables, 1, budget=8, attention=False)


@pytest.mark.parametrize(("cfg", "steps"), [((1024, 1024, 1), [1]), ((2048, 512, 4), [2, 2]),
                                            ((512, 2048, 8), [8]), ((4096, 256, 2), [1, 1]),
                                            ((5000, 8, 3), [1, 1, 1])])
def test_prefill_steps_of_the_paper_configs(cfg: tuple[int, int, int], steps: list[int]) -> None:
    assert E.prefill_steps(E.Config(*cfg), 4096) == steps


@given(st.integers(1, 9000), st.integers(1, 64), st.integers(1, 8192))
def test_prefill_steps_cover_the_batch_within_the_budget(inp: int, batch: int,
                                                         budget: int) -> None:
    steps = E.prefill_steps(E.Config(inp, 1, batch), budget)
    assert sum(steps) == batch
    assert all(k >= 1 and (k * inp <= budget or k == 1) for k in steps)


def _sim_latencies(scale_a: float = 1.0) -> list[object]:
    spec = ModelSpec("m", 4, 1024, 8, 2, 128, 4096, 32000)
    out = []
    for cfg in (E.Config(1024, 64, 1), E.Config(512, 32, 8)):
        for name in ("A100-80GB", "H100-SXM", "A40"):
            gpu = get_gpu(name)
            tables = E.sim_tables(spec, 1, gpu, efficiency_for(gpu))
            meas = E.compose(cfg, tables, spec.n_layers)
            pred = meas * (scale_a if name == "A100-80GB" else 1.0)
            out.append(E.Latency("m", 1, cfg, name, meas, pred, True))
    return out


def test_simulator_identical_to_measurement_has_zero_speedup_error() -> None:
    rows = E.speedup_rows(_sim_latencies())
    assert len(rows) == 2 * 3  # two configs x three GPU pairs
    assert all(r["error"] == pytest.approx(0.0, abs=1e-12) for r in rows)
    stats = E.summary(rows, ["(1024,64,1)"])
    assert stats["max_speedup_err_e2e"] == pytest.approx(0.0, abs=1e-12)
    assert stats["e2e_pairs"] == 6


def test_a_biased_gpu_shows_up_as_speedup_error() -> None:
    rows = E.speedup_rows(_sim_latencies(scale_a=1.25))  # A100 predicted 25 % slow
    errs = {(r["gpu_a"], r["gpu_b"]): r["error"] for r in rows}
    assert errs[("A100-80GB", "H100-SXM")] == pytest.approx(0.25)
    assert errs[("A100-80GB", "A40")] == pytest.approx(0.25)
    assert errs[("A40", "H100-SXM")] == pytest.approx(0.0, abs=1e-12)


def test_measured_compositions_of_a_gqa_model() -> None:
    require_data(PROFILES / "vidur", PROFILES / "aiconfigurator")
    sim_accuracy = load_benchmark("sim_accuracy")
    gpus = {d: get_gpu(g) for d, g in sim_accuracy.VIDUR_GPUS.items()}
    effs = {g.name: efficiency_for(g) for g in gpus.values()}
    lats = E.collect(PROFILES / "vidur" / "compute", gpus, sim_accuracy.attention_sets(DATA),
                     effs, E.PAPER_CONFIGS, tps=(4,), models=["CodeLlama-34b-Instruct-hf"])
    rows = E.speedup_rows(lats)
    e2e = [r for r in rows if r["composition"] == "end-to-end"]
    assert {(r["gpu_a"], r["gpu_b"]) for r in e2e} == {("A100-80GB", "H100-SXM")}
    assert len(e2e) == 3
    for r in e2e:  # H100 is 1.5-2.5x faster end to end; the prediction tracks it
        assert 1.5 < r["measured_speedup_b_over_a"] < 2.5
        assert r["error"] < 0.06
    assert any(r["composition"] == "linear-only" and "A40" in (r["gpu_a"], r["gpu_b"])
               for r in rows)
