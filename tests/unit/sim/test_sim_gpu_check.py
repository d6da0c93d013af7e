"""benchmarks/sim_gpu_check.py: its case shapes are the simulator's shards, its predictions are
the simulator's own costs, and its CPU measurement path runs end to end."""

from __future__ import annotations

import pytest

from llmfabric.sim import efficiency_for, get_gpu, get_model
from llmfabric.sim.costs import op_time
from llmfabric.sim.operators import layer_linear_ops
from llmfabric.testing.benchmark_module import load_benchmark

G = load_benchmark("sim_gpu_check")
GPU = get_gpu("H100-SXM")
EFF = efficiency_for(GPU)


def _gemm(model: str, tp: int, op: str, m: int = 1) -> object:
    found = [c for c in G.gemm_cases((m,)) if (c.model, c.tp, c.op) == (model, tp, op)]
    assert len(found) == 1
    return found[0]


def test_gemm_shapes_are_the_published_shards() -> None:
    # (n, k) of the projections: Llama-3.1-8B (hidden 4096, 32/8 heads, FFN 14336),
    # Llama-3.1-70B (hidden 8192, 64/8 heads, FFN 28672) sharded over TP, and Qwen3-32B
    # (hidden 5120, 64/8 heads of 128: q is 8192 wide, not the hidden size; FFN 25600)
    expected = {
        ("llama-3.1-8b", 1, "qkv_proj"): (6144, 4096),
        ("llama-3.1-8b", 1, "mlp_gate_up"): (28672, 4096),
        ("llama-3.1-8b", 1, "mlp_down"): (4096, 14336),
        ("llama-3.1-70b", 1, "qkv_proj"): (10240, 8192),
        ("llama-3.1-70b", 4, "qkv_proj"): (2560, 8192),
        ("llama-3.1-70b", 4, "mlp_down"): (8192, 7168),
        ("llama-3.1-70b", 8, "o_proj"): (8192, 1024),
        ("llama-3.1-70b", 8, "qkv_proj"): (1280, 8192),
        ("qwen3-32b", 1, "qkv_proj"): (10240, 5120),
        ("qwen3-32b", 1, "o_proj"): (5120, 8192),
        ("qwen3-32b", 1, "mlp_gate_up"): (51200, 5120),
        ("qwen3-32b", 1, "mlp_down"): (5120, 25600),
    }
    for (model, tp, op), nk in expected.items():
        case = _gemm(model, tp, op)
        assert (case.n, case.k) == nk, (model, tp, op)


def test_case_lists_cover_every_class_and_deployment() -> None:
    full, quick = G.all_cases(False), G.all_cases(True)
    assert set(quick) < set(full)
    n = len(G.DEPLOYMENTS)  # x (4 GEMMs x 9 M; 3 prefill + 4 x 2 decode attention) + 3 copies
    assert n == 5 and len(full) == n * 4 * 9 + n * (3 + 4 * 2) + 3
    for cases in (full, quick):
        assert {c.cls for c in cases} == {"gemm", "attn_prefill", "attn_decode", "hbm_copy"}
        for cls in ("gemm", "attn_prefill", "attn_decode"):
            assert {(c.model, c.tp) for c in cases if c.cls == cls} == set(G.DEPLOYMENTS)
    heads = {(c.model, c.tp): (c.heads, c.kv_heads) for c in full if c.cls == "attn_decode"}
    assert heads[("llama-3.1-70b", 8)] == (8, 1)
    assert heads[("llama-3.1-70b", 4)] == (16, 2)
    assert heads[("llama-3.1-8b", 1)] == (32, 8)


def test_gemm_prediction_is_the_simulators_op_time() -> None:
    ops = {o.name: o for o in layer_linear_ops(get_model("llama-3.1-70b"), 4)}
    for m in (1, 512, 8192):
        case = _gemm("llama-3.1-70b", 4, "mlp_gate_up", m)
        assert G.predict(case, GPU, EFF) == op_time(ops["mlp_gate_up"].cost(m), GPU, EFF, 16)
    times = [
        G.predict(c, GPU, EFF)
        for c in G.gemm_cases(G.GEMM_M)
        if (c.model, c.tp, c.op) == ("llama-3.1-8b", 1, "mlp_down")
    ]
    assert times == sorted(times) and times[-1] > 10 * times[0]


def test_attention_and_copy_predictions_grow_with_the_work() -> None:
    dec = {
        (c.batch, c.context): G.predict(c, GPU, EFF)
        for c in G.all_cases(False)
        if c.cls == "attn_decode" and c.tp == 1 and c.model == "llama-3.1-8b"
    }
    assert dec[(256, 4096)] > dec[(256, 1024)] > dec[(16, 1024)] > dec[(1, 1024)] > 0
    pre = [
        G.predict(c, GPU, EFF)
        for c in G.all_cases(False)
        if c.cls == "attn_prefill" and c.tp == 1 and c.model == "llama-3.1-70b"
    ]
    assert pre == sorted(pre) and pre[-1] > 20 * pre[0]  # quadratic in the sequence
    big = G.copy_cases((1 << 30,))[0]
    bw = 2 * (1 << 30) / (G.predict(big, GPU, EFF) - EFF.kernel_overhead_s)
    assert bw == pytest.approx(GPU.mem_bw * EFF.memory, rel=1e-9)


def test_summarize_by_hand() -> None:
    rows = [
        {"cls": "gemm", "op": "o_proj", "error": 0.1},
        {"cls": "gemm", "op": "mlp_down", "error": -0.3},
        {"cls": "attn_decode", "op": "attention", "error": -0.2},
    ]
    s = G.summarize(rows)
    assert s["mape"] == pytest.approx(0.2)
    assert s["mape_by_class"] == pytest.approx({"attn_decode": 0.2, "gemm": 0.2})
    assert s["mape_by_gemm_op"] == pytest.approx({"mlp_down": 0.3, "o_proj": 0.1})
    assert s["rows"] == 3


def test_cpu_budget_keeps_small_cases_only() -> None:
    small = _gemm("llama-3.1-8b", 1, "o_proj", 1)
    assert G.within_cpu_budget(small)
    assert not G.within_cpu_budget(_gemm("llama-3.1-70b", 1, "mlp_gate_up", 8192))
    huge = [c for c in G.all_cases(False) if c.cls == "attn_decode" and c.batch == 256]
    assert not any(G.within_cpu_budget(c) for c in huge)


def test_cpu_measurement_end_to_end() -> None:
    pytest.importorskip("torch")
    cases = [
        _gemm("llama-3.1-70b", 8, "o_proj", 8),
        G.copy_cases((1 << 20,))[0],
        *[c for c in G.attention_cases((512,), (1,), (1024,)) if c.tp == 8],
    ]
    rows, skipped, env = G.measure(cases, GPU, EFF, "cpu", 0, 2, "default", lambda _: None)
    assert skipped == [] and env["failed"] == [] and env["device_name"] == "cpu"
    assert [r["cls"] for r in rows] == ["gemm", "hbm_copy", "attn_prefill", "attn_decode"]
    assert [G.Case(**r["case_fields"]) for r in rows] == cases  # the CUDA profiling pass
    for r in rows:
        assert r["measured_us"] > 0
        assert r["error"] == pytest.approx(r["predicted_us"] / r["measured_us"] - 1)


def test_no_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert G.main(["--gpu", "H100-SXM", "--quick"]) == 2
    assert "torch.cuda is not available" in capsys.readouterr().err
