"""Shipped calibration against the measured operator profiles (without the shared data: skips
outside CI, fails in CI)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from llmfabric.sim import DEFAULT_EFFICIENCY, ModelSpec, efficiency_for, get_gpu
from llmfabric.sim.calibration import CALIBRATED
from llmfabric.sim.costs import op_time
from llmfabric.sim.operators import layer_linear_ops
from llmfabric.testing.shared_data import require_data, shared_data

VIDUR = shared_data("operator-profiles", "vidur", "compute")
OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def test_siblings_borrow_calibrated_rows() -> None:
    assert efficiency_for(get_gpu("H200")) == CALIBRATED["H100-SXM"]
    assert efficiency_for(get_gpu("A100-40GB")) == CALIBRATED["A100-80GB"]
    assert efficiency_for(get_gpu("MI300X")) == DEFAULT_EFFICIENCY


@pytest.mark.parametrize(("gdir", "gpu"), [("h100", "H100-SXM"), ("a100", "A100-80GB"),
                                           ("a40", "A40")])
def test_layer_linear_time_matches_vidur_profiles(gdir: str, gpu: str) -> None:
    path = VIDUR / gdir / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    require_data(path)
    with path.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["num_tensor_parallel_workers"] == "1"]
    spec = ModelSpec("llama-2-7b-layer", 1, 4096, 32, 32, 128, 11008, 32000)
    g = get_gpu(gpu)
    eff = efficiency_for(g)
    errors = []
    for r in rows:
        m = int(r["num_tokens"])
        measured = sum(float(r[f"time_stats.{o}.median"]) for o in OPS) / 1e3
        predicted = sum(op_time(op.cost(m), g, eff) for op in layer_linear_ops(spec, 1))
        errors.append(abs(predicted / measured - 1))
    assert len(errors) > 50
    assert float(np.mean(errors)) < 0.12
