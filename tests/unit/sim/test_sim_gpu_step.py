"""benchmarks/sim_gpu_step.py: the decode step it times is a real Llama-style step (run here
on the CPU with a tiny model: greedy tokens, the new K/V written at the last position), and
its prediction is the simulator's step minus the per-iteration overhead a CUDA graph lacks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from llmfabric.sim import get_gpu, get_model
from llmfabric.sim.costs import cost_model
from llmfabric.sim.models import ModelSpec

ROOT = Path(__file__).resolve().parents[3]
torch = pytest.importorskip("torch")


def _load() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports _common beside it
    spec = importlib.util.spec_from_file_location(
        "sim_gpu_step", ROOT / "benchmarks" / "sim_gpu_step.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sim_gpu_step", module)  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module


G = _load()
TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_hidden=96, vocab=50)


def test_the_step_picks_one_token_per_sequence_and_writes_the_new_kv() -> None:
    torch.manual_seed(0)
    step = G.Step(torch, TINY, batch=3, context=8, device="cpu")
    before = [k[:, :, -1].clone() for k, _ in step.cache]
    untouched = [k[:, :, 0].clone() for k, _ in step.cache]
    with torch.inference_mode():
        tokens = step()
    assert tokens.shape == (3,) and tokens.dtype == torch.long
    assert bool(((tokens >= 0) & (tokens < TINY.vocab)).all())
    for (k, _), old_last, old_first in zip(step.cache, before, untouched, strict=True):
        assert not torch.equal(k[:, :, -1], old_last)  # the new key went to the last slot
        assert torch.equal(k[:, :, 0], old_first)  # and nowhere else


def test_the_prediction_is_the_simulators_step_without_its_iteration_overhead() -> None:
    model, gpu = get_model(G.MODEL), get_gpu("H100-SXM")
    cm = cost_model(model, gpu, 1)
    for batch, context in G.CASES:
        gpu_s, full_s = G.predicted_s(model, gpu.name, G.StepCase(batch, context))
        assert full_s == pytest.approx(cm.decode_step_time(batch, batch * context))
        assert full_s - gpu_s == pytest.approx(cm.step_overhead_s)
        assert batch * context <= G.MAX_CACHED_TOKENS
