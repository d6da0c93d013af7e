"""Engine profiles, engine CPU time, the jittered closed loop and Blackwell/FP4 specs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import (
    PROFILES,
    EngineConfig,
    SpecError,
    cost_model,
    get_gpu,
    get_model,
    get_profile,
    replay,
    simulate_closed_loop,
    simulate_replica,
)

pytestmark = pytest.mark.unit
M = "llama-3.1-8b"


def test_for_engine_takes_the_profile_and_overrides() -> None:
    sg = EngineConfig.for_engine("SGLang")
    assert not sg.chunked_prefill and sg.max_num_seqs == PROFILES["sglang"].max_num_seqs
    v = EngineConfig.for_engine("vllm", max_num_seqs=512)
    assert v.chunked_prefill and v.max_num_seqs == 512 and v.max_batched_tokens == 8192
    assert EngineConfig.for_engine("tensorrt-llm") == EngineConfig.for_engine("trtllm")
    real = [p for name, p in PROFILES.items() if name != "plain"]
    assert all(p.max_num_seqs > 256 for p in real)  # no fixed 256 cap
    assert EngineConfig.for_engine("plain") == EngineConfig()  # the engine before profiles
    with pytest.raises(SpecError, match="unknown engine profile"):
        EngineConfig.for_engine("tgi")
    with pytest.raises(SpecError):
        EngineConfig(step_cpu_s=-1.0)


def test_cpu_time_is_per_step_plus_per_sequence() -> None:
    cfg = EngineConfig(step_cpu_s=1e-3, step_cpu_per_seq_s=1e-5)
    assert cfg.cpu_time(10) == pytest.approx(1.1e-3)
    assert cfg.cpu_time(0) == pytest.approx(1e-3)


@pytest.mark.parametrize("chunked", [False, True])
def test_engine_cpu_time_adds_once_per_iteration(chunked: bool) -> None:
    """One request of 64 output tokens runs 64 iterations (one prefill, 63 decodes), each
    with one sequence: its E2E grows by exactly 64 x (step + per-sequence CPU)."""
    wl = replay([(0.0, 300, 64)])
    base = simulate_replica(M, "H100", 1, wl, config=EngineConfig(chunked_prefill=chunked))
    cpu = EngineConfig(chunked_prefill=chunked, step_cpu_s=2e-3, step_cpu_per_seq_s=1e-4)
    slow = simulate_replica(M, "H100", 1, wl, config=cpu)
    assert slow.e2e_s[0] - base.e2e_s[0] == pytest.approx(64 * 2.1e-3, rel=1e-9)
    assert slow.ttft_s[0] - base.ttft_s[0] == pytest.approx(2.1e-3, rel=1e-9)


def test_prefill_first_clients_without_jitter_stay_in_lockstep() -> None:
    res = simulate_closed_loop(M, "H100", 1, 16, 96, 1024, 64, engine_profile="sglang",
                               jitter_s=0.0, request_overhead_s=0.0)
    assert res.steady_ttft_s == pytest.approx(res.first_wave_ttft_s, rel=1e-9)
    assert res.n_completed == 96


def test_jitter_desynchronizes_clients_and_is_seeded() -> None:
    """Prefill-first clients in lockstep pay the whole first-wave queue in every wave; with
    a client delay comparable to a request's life they drift apart."""
    kw = {"engine_profile": "sglang", "request_overhead_s": 0.0}
    still = simulate_closed_loop(M, "H100", 1, 32, 320, 1024, 128, jitter_s=0.0, **kw)
    drift = simulate_closed_loop(M, "H100", 1, 32, 320, 1024, 128, jitter_s=0.3, seed=3, **kw)
    again = simulate_closed_loop(M, "H100", 1, 32, 320, 1024, 128, jitter_s=0.3, seed=3, **kw)
    other = simulate_closed_loop(M, "H100", 1, 32, 320, 1024, 128, jitter_s=0.3, seed=4, **kw)
    assert drift.steady_ttft_s < 0.7 * still.steady_ttft_s
    assert drift.steady_ttft_s < drift.first_wave_ttft_s
    np.testing.assert_array_equal(drift.ttft_s, again.ttft_s)
    assert not np.array_equal(drift.ttft_s, other.ttft_s)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_closed_loop_never_exceeds_its_concurrency(profile: str) -> None:
    c = 12
    res = simulate_closed_loop(M, "H100", 1, c, 90, 700, 40, engine_profile=profile,
                               jitter_s=0.02, seed=1)
    start, end = res.arrival_s, res.arrival_s + res.e2e_s
    assert np.all(np.isfinite(end))
    for t in start:  # requests in flight at each send (the one sent at t included)
        assert int(np.sum((start <= t) & (end > t))) <= c
    assert res.n_completed == 90 and res.concurrency == c
    # the steady state excludes exactly the first wave
    assert res.steady_ttft_s == pytest.approx(float(np.mean(res.ttft_s[c:])))
    assert res.first_wave_ttft_s == pytest.approx(float(np.mean(res.ttft_s[:c])))


def test_front_end_latency_is_inside_ttft() -> None:
    a = simulate_closed_loop(M, "H100", 1, 1, 5, 512, 16, jitter_s=0.0, request_overhead_s=0.0)
    b = simulate_closed_loop(M, "H100", 1, 1, 5, 512, 16, jitter_s=0.0,
                             request_overhead_s=0.05)
    np.testing.assert_allclose(b.ttft_s - a.ttft_s, 0.05, rtol=1e-9)
    np.testing.assert_allclose(b.tpot_s, a.tpot_s, rtol=1e-12)
    with pytest.raises(SpecError):
        simulate_closed_loop(M, "H100", 1, 1, 5, 512, 16, jitter_s=-1.0)


def test_profile_config_is_used_and_config_overrides_it() -> None:
    prof = dataclasses.replace(get_profile("vllm"), step_cpu_s=0.0, client_jitter_s=0.0)
    slow = dataclasses.replace(prof, step_cpu_s=5e-3)
    a = simulate_closed_loop(M, "H100", 1, 1, 3, 256, 32, engine_profile=prof)
    b = simulate_closed_loop(M, "H100", 1, 1, 3, 256, 32, engine_profile=slow)
    assert b.steady_tpot_s - a.steady_tpot_s == pytest.approx(5e-3, rel=1e-6)
    c = simulate_closed_loop(M, "H100", 1, 1, 3, 256, 32, engine_profile=slow,
                             config=EngineConfig(**prof.config_kwargs()))
    assert c.steady_tpot_s == pytest.approx(a.steady_tpot_s, rel=1e-12)


def test_blackwell_specs_and_fp4_gemms() -> None:
    b200, gb200 = get_gpu("b200_sxm"), get_gpu("GB200")
    assert b200.name == "B200" and gb200.name == "GB200"
    assert b200.fp4_flops == 9000e12 and b200.fp8_flops == 4500e12
    assert b200.flops(4) == 9000e12 and b200.flops(8) == 4500e12 and b200.flops(16) == 2250e12
    assert get_gpu("H100").flops(4) == get_gpu("H100").fp8_flops  # no FP4: next wider
    assert b200.mem_bw == 8000e9 and gb200.mem_bytes == 186e9
    base = get_model("llama-3.1-70b")
    fp8 = base.with_quantization(8, 8, gemm_bits=8)
    fp4 = base.with_quantization(4, 8, gemm_bits=4)
    w4 = base.with_quantization(weight_bits=4)  # weight-only: dequantized to BF16 GEMMs
    assert (fp8.matmul_bits, fp4.matmul_bits, w4.matmul_bits, base.matmul_bits) == (8, 4, 16, 16)
    with pytest.raises(SpecError):
        base.with_quantization(gemm_bits=6)
    # a large prefill is compute-bound: FP4 < FP8 < BF16 on a B200
    t = [cost_model(m, "B200", 1).prefill_time([8192]) for m in (fp4, fp8, base)]
    assert t[0] < t[1] < t[2]
    # memory: FP8 KV holds twice the tokens of BF16 KV per byte
    assert fp8.kv_bytes_per_token() * 2 == base.kv_bytes_per_token()


def test_output_jitter_keeps_outputs_within_bounds_and_breaks_clusters() -> None:
    """Outputs are drawn from OSL -/+ k tokens (seeded); clients then finish whole steps
    apart, so chunked-prefill clusters dissolve and the steady TTFT falls."""
    kw = {"engine_profile": "vllm", "jitter_s": 0.0, "request_overhead_s": 0.0}
    lock = simulate_closed_loop(M, "H100", 1, 32, 256, 2048, 128, output_jitter_tokens=0.0,
                                **kw)
    drift = simulate_closed_loop(M, "H100", 1, 32, 256, 2048, 128, output_jitter_tokens=6.0,
                                 seed=2, **kw)
    outs = np.rint((drift.e2e_s - drift.ttft_s) / drift.tpot_s) + 1
    assert outs.min() >= 122 and outs.max() <= 134 and len(set(outs.tolist())) > 5
    assert abs(outs.mean() - 128) < 1.0
    lock_outs = np.rint((lock.e2e_s - lock.ttft_s) / lock.tpot_s) + 1
    assert set(lock_outs.tolist()) == {128.0}
    assert drift.steady_ttft_s < 0.7 * lock.steady_ttft_s
    with pytest.raises(SpecError):
        simulate_closed_loop(M, "H100", 1, 2, 4, 64, 8, output_jitter_tokens=-1.0)


def test_no_evict_admission_queues_instead_of_preempting() -> None:
    """Capacity for about two whole requests (2 x (100 + 200 + 8) tokens at a 1 % watermark):
    plain admission over-admits and preempts as outputs grow; GUARANTEED_NO_EVICT admission
    runs at most two at once and never preempts."""
    wl = replay([(0.0, 100, 200)] * 6)
    cap = 640  # 633.6 usable: two requests' full 616 tokens fit, a third never
    plain = simulate_replica(M, "H100", 1, wl, config=EngineConfig(kv_capacity_tokens=cap))
    safe = simulate_replica(M, "H100", 1, wl,
                            config=EngineConfig(kv_capacity_tokens=cap, no_evict=True))
    assert plain.preemptions > 0 and safe.preemptions == 0
    assert safe.n_completed == 6
    first, done = safe.ttft_s, safe.e2e_s  # arrivals at 0: times since t = 0
    for t in first:
        assert int(np.sum((first <= t) & (done > t))) <= 2
    assert EngineConfig.for_engine("trtllm").no_evict
    # beside one that fits, a request whose whole output can never fit is rejected, not stuck
    # (a workload of only such requests is a layout error: simulate_cluster raises)
    mixed = simulate_replica(M, "H100", 1, replay([(0.0, 100, 200), (0.0, 100, 600)]),
                             config=EngineConfig(kv_capacity_tokens=cap, no_evict=True))
    assert mixed.n_rejected == 1 and mixed.n_completed == 1


def test_kv_share_of_free_memory_is_hand_computed() -> None:
    """TensorRT-LLM sizes its KV cache as a share of the memory left after the weights."""
    from llmfabric.sim import plan_memory
    from llmfabric.sim.serving import ReplicaSpec, _kv_capacity

    full = plan_memory("llama-3.1-8b", "H100", 1, gpu_memory_utilization=1.0)
    spec = ReplicaSpec.of("llama-3.1-8b", "H100", 1,
                          config=EngineConfig(kv_fraction_of_free=0.5))
    assert _kv_capacity(spec) == int(full.kv_capacity_tokens * 0.5) // 16 * 16
    with pytest.raises(SpecError):
        EngineConfig(kv_fraction_of_free=1.5)


def test_fp8_gemms_reach_a_fitted_share_of_the_bf16_efficiency() -> None:
    """A compute-bound GEMM at FP8 runs at peak(FP8) x compute x low_precision_compute: on the
    H100 (FP8 peak = 2 x BF16) it takes 1 / (2 x 0.61) of the BF16 time, not half."""
    from llmfabric.sim import efficiency_for
    from llmfabric.sim.costs import op_time
    from llmfabric.sim.operators import OpCost

    gpu = get_gpu("H100")
    eff = dataclasses.replace(efficiency_for(gpu), kernel_overhead_s=0.0)
    assert eff.low_precision_compute == pytest.approx(0.61)
    big = OpCost("gemm", 2.0 * 8192 * 8192 * 8192, 1.0)  # compute-bound: bytes negligible
    ratio = op_time(big, gpu, eff, 8) / op_time(big, gpu, eff, 16)
    assert ratio == pytest.approx(gpu.fp16_flops / (gpu.fp8_flops * 0.61), rel=1e-6)
    plain = dataclasses.replace(eff, low_precision_compute=1.0)
    assert op_time(big, gpu, plain, 8) / op_time(big, gpu, plain, 16) == pytest.approx(0.5,
                                                                                         rel=1e-3)
    with pytest.raises(SpecError):
        dataclasses.replace(eff, low_precision_compute=0.0)


@settings(max_examples=40, deadline=None)
@given(reqs=st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 2500),
                               st.integers(1, 400)), min_size=1, max_size=30),
       cap=st.sampled_from([2048, 6000, 20000]), chunked=st.booleans())
def test_no_evict_never_preempts_and_stays_within_the_kv(reqs: list[tuple[float, int, int]],
                                                         cap: int, chunked: bool) -> None:
    from llmfabric.sim.engine import Replica, RequestBook

    wl = replay(reqs)
    book = RequestBook(wl.arrival_s.tolist(), wl.input_tokens.tolist(),
                       wl.output_tokens.tolist())
    cfg = EngineConfig(kv_capacity_tokens=cap, no_evict=True, chunked_prefill=chunked)
    rep = Replica(0, cost_model("qwen3-1.7b", "L40S"), cfg, cap, book)
    for rid, (t, p, o) in enumerate(zip(book.arrival, book.input_tokens, book.output_tokens,
                                        strict=True)):
        rep.advance_to(t)
        rep.submit(rid, p, o)
    rep.drain()
    assert rep.preemptions == 0
    assert rep.kv_peak_tokens <= rep.capacity + 1e-9
    for rid in range(len(wl)):
        fits = book.input_tokens[rid] + book.output_tokens[rid] + 8 <= rep.capacity
        assert book.truncated[rid] != fits  # rejected exactly when its whole output can't fit
        if fits:
            assert book.finish[rid] >= book.first_token[rid] >= book.arrival[rid]


def _two_prompt_steps(whole: bool) -> tuple[list[int], list[float]]:
    """Busy tokens per iteration and first-token times of two 60-token prompts under a
    100-token budget (both queued at t = 0)."""
    from llmfabric.sim.engine import Replica, RequestBook

    book = RequestBook([0.0, 0.0], [60, 60], [3, 3])
    cfg = EngineConfig(chunked_prefill=True, max_batched_tokens=100, whole_prompts=whole)
    rep = Replica(0, cost_model(M, "H100", 1, 1), cfg, 50_000, book)
    rep.submit(0, 60, 3)
    rep.submit(1, 60, 3)
    rep.drain()
    return rep.busy_tokens, book.first_token


def test_whole_prompts_wait_for_the_next_step_instead_of_a_chunk() -> None:
    # chunked: step 1 = prompt 0 (60) + 40 tokens of prompt 1; step 2 = 1 decode + 20
    tokens, first = _two_prompt_steps(False)
    assert tokens[:2] == [100, 21]
    # whole prompts (TensorRT-LLM without context chunking): prompt 1 does not fit in the 40
    # left, so step 1 carries prompt 0 alone and step 2 prompt 1 whole beside 1 decode
    tokens_w, first_w = _two_prompt_steps(True)
    assert tokens_w[:2] == [60, 61]
    assert first_w[0] < first[0]  # prompt 0 no longer shares its step with a chunk
    assert all(t <= 100 for t in tokens_w)


def test_whole_prompts_still_chunk_a_prompt_longer_than_the_budget() -> None:
    from llmfabric.sim.engine import Replica, RequestBook

    book = RequestBook([0.0], [250], [2])
    cfg = EngineConfig(chunked_prefill=True, max_batched_tokens=100, whole_prompts=True)
    rep = Replica(0, cost_model(M, "H100", 1, 1), cfg, 50_000, book)
    rep.submit(0, 250, 2)
    rep.drain()
    assert rep.busy_tokens == [100, 100, 50, 1]  # the step's first prompt is chunked
    assert EngineConfig.for_engine("trtllm").whole_prompts is False  # see docs/simulator.md


@pytest.mark.parametrize("chunked", [False, True])
def test_prompt_step_cpu_is_paid_once_per_step_that_carries_a_prompt(chunked: bool) -> None:
    # one request alone: its single prompt step costs exactly prompt_step_cpu_s more, so TTFT
    # grows by that much and the decode steps (TPOT) do not change
    base = EngineConfig(chunked_prefill=chunked)
    slow = dataclasses.replace(base, prompt_step_cpu_s=0.02)
    wl = replay([(0.0, 512, 8)])
    a = simulate_replica(M, "H100", 1, wl, config=base)
    b = simulate_replica(M, "H100", 1, wl, config=slow)
    assert b.ttft_s[0] - a.ttft_s[0] == pytest.approx(0.02, rel=1e-9)
    assert b.tpot_s[0] == pytest.approx(a.tpot_s[0], rel=1e-12)
    # two prompts in one prefill-first batch / one mixed step: paid once, not per prompt
    two = replay([(0.0, 256, 8), (0.0, 256, 8)])
    a2 = simulate_replica(M, "H100", 1, two, config=base)
    b2 = simulate_replica(M, "H100", 1, two, config=slow)
    np.testing.assert_allclose(b2.ttft_s - a2.ttft_s, 0.02, rtol=1e-9)
    assert all(p.prompt_step_cpu_s == 0 for p in PROFILES.values())  # shipped off
    with pytest.raises(SpecError, match="prompt_step_cpu_s"):
        EngineConfig(prompt_step_cpu_s=-1e-3)
