"""benchmarks/sim_gpu_step.py: the decode step it times is a real Llama-style step (run here
on the CPU with a tiny model: greedy tokens, the new K/V written at the last position), and
its prediction is the simulator's step minus the per-iteration overhead a CUDA graph lacks."""

from __future__ import annotations

import pytest

from llmfabric.sim import get_gpu, get_model
from llmfabric.sim.costs import cost_model
from llmfabric.sim.hardware import GPUSpec
from llmfabric.sim.models import ModelSpec
from llmfabric.testing.benchmark_module import load_benchmark

torch = pytest.importorskip("torch")


G = load_benchmark("sim_gpu_step")
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
    gpu = get_gpu("H100-SXM")
    for name, (steps, max_cached) in G.STEPS.items():
        check_predictions(get_model(name), gpu, steps, max_cached)


def check_predictions(model: ModelSpec, gpu: GPUSpec, steps: tuple[tuple[int, ...], ...],
                      max_cached: int) -> None:
    cm = cost_model(model, gpu, 1)
    for fields in steps:
        case = G.StepCase(*fields)
        gpu_s, full_s = G.predicted_s(model, gpu.name, case)
        b, ctx = case.batch, case.context
        expected = (cm.mixed_step_time(b, b * ctx, [(case.chunk, case.prefix)], 1)
                    if case.chunk else cm.decode_step_time(b, b * ctx))
        assert full_s == pytest.approx(expected)
        assert full_s - gpu_s == pytest.approx(cm.step_overhead_s)
        assert b * ctx <= max_cached


def test_a_mixed_step_attends_the_chunk_causally_over_its_prefix() -> None:
    """One prompt chunk of 3 tokens after 2 cached ones rides with 2 decodes: 3 tokens are
    picked (2 decodes + the chunk's last), the chunk's K/V land at positions 2-4 only, and
    its mask lets token i see positions <= 2 + i."""
    torch.manual_seed(0)
    step = G.Step(torch, TINY, batch=2, context=8, device="cpu", chunk=3, prefix=2)
    prefix_before = [k[:, :, :2].clone() for k, _ in step.p_cache]
    chunk_before = [k[:, :, 2:].clone() for k, _ in step.p_cache]
    with torch.inference_mode():
        tokens = step()
    assert tokens.shape == (3,)
    for (k, _), old, was in zip(step.p_cache, prefix_before, chunk_before, strict=True):
        assert torch.equal(k[:, :, :2], old)  # the cached prefix untouched
        for pos in range(3):  # every chunk position written
            assert not torch.equal(k[:, :, 2 + pos], was[:, :, pos])
    # the chunk's attention is causal aligned to the bottom right: same as an explicit mask
    # where chunk token i sees positions <= 2 + i
    q = torch.randn(1, TINY.n_heads, 3, TINY.head_dim)
    k, v = (torch.randn(1, TINY.n_kv_heads, 5, TINY.head_dim) for _ in range(2))
    mask = torch.tensor([[True, True, True, False, False],
                         [True, True, True, True, False],
                         [True, True, True, True, True]])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.allclose(sdpa(q, k, v, attn_mask=step.p_bias, enable_gqa=True),
                          sdpa(q, k, v, attn_mask=mask, enable_gqa=True), atol=1e-6)
    gpu_s, full_s = G.predicted_s(get_model(G.MODEL), "H100-SXM", G.StepCase(64, 1024, 512, 0))
    decode_s, _ = G.predicted_s(get_model(G.MODEL), "H100-SXM", G.StepCase(64, 1024))
    assert full_s > gpu_s > decode_s  # the chunk costs something
