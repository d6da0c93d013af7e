"""The vectorised and shared cost tables equal the per-batch / per-deployment originals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llmfabric.sim import costs
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.models import get_model
from llmfabric.sim.parallel import Deployment, Stage


@pytest.mark.parametrize("gpu", ["A40", "RTX-3090-Ti", "H100"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_wave_tables_equal_the_scalar_functions(gpu: str, tp: int) -> None:
    model = get_model("llama-30b")
    dep = Deployment(model, (Stage(get_gpu(gpu), tp, 30), Stage(get_gpu("A40"), tp, 30)))
    cm = costs.build_cost_model(dep, table_tokens=64)
    batches = np.arange(600, dtype=np.float64)
    scalar = np.array([costs._wave_time(model, cm.stages, int(b)) for b in batches])
    assert np.array_equal(costs._wave_table(model, cm.stages, batches), scalar)
    for st in cm.stages:
        nkv = costs.heads_per_gpu(model, st.tp)[1]
        one = np.array([costs.decode_extra_waves(st.gpu, int(b), nkv) for b in batches])
        assert np.array_equal(costs._extra_waves_array(st.gpu, batches, nkv), one)
    assert cm.decode_wave_time(300) == costs._wave_time(model, cm.stages, 300)


def test_shared_layer_table_gives_the_same_model_as_a_fresh_build() -> None:
    model = get_model("llama-30b")
    dep = Deployment(model, (Stage(get_gpu("A40"), 2, 25), Stage(get_gpu("A40"), 2, 35)))
    costs._LAYER_TABLES.clear()
    fresh = costs.build_cost_model(dep, table_tokens=128)
    again = costs.build_cost_model(dep, table_tokens=128)  # every layer table now shared
    assert costs._LAYER_TABLES
    for a, b in (
        (fresh.prefill_time([100]), again.prefill_time([100])),
        (fresh.decode_step_time(7, 7 * 900), again.decode_step_time(7, 7 * 900)),
    ):
        assert a == b
    table = next(iter(costs._LAYER_TABLES.values()))
    with pytest.raises(ValueError):
        table[0] = 1.0  # shared: read-only


def test_pipeline_stage_models_share_the_layer_tables() -> None:
    model = get_model("llama-30b")
    dep = Deployment(model, (Stage(get_gpu("A40"), 4, 30), Stage(get_gpu("A40"), 4, 30)))
    costs._LAYER_TABLES.clear()
    costs.build_cost_model(dep, table_tokens=128)
    n = len(costs._LAYER_TABLES)
    for layers, name in ((30, "llama-30b[stage 0]"), (7, "other")):
        sub = dataclasses.replace(model, n_layers=layers, name=name, aliases=())
        costs.build_cost_model(
            Deployment(sub, (Stage(get_gpu("A40"), 4, layers),)), table_tokens=128
        )
    assert len(costs._LAYER_TABLES) == n  # no new table: same shape, GPU and TP
