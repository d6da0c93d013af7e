"""Engine additions for the scheduling papers: pipelined PP (micro-batches overlapping across
stages), drain-free role flips mid-run, and pause/resume."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import EngineConfig, get_gpu, get_model, poisson, simulate_replica
from llmfabric.sim.costs import cost_model, cost_model_for
from llmfabric.sim.engine import Replica, RequestBook
from llmfabric.sim.parallel import Deployment, Link, Stage
from llmfabric.sim.pipeline import PipelineCost

M70 = "llama-3.1-70b"


def test_pipelined_pp_single_sequence_pays_the_sum_of_stages() -> None:
    cm = cost_model(M70, "A100-80GB", 4, 2)
    pipe = PipelineCost(cm)
    assert pipe.prefill_time([2048]) == pytest.approx(cm.prefill_time([2048]), rel=1e-9)
    assert pipe.decode_step_time(1, 1500) == pytest.approx(cm.decode_step_time(1, 1500),
                                                           rel=1e-9)


def test_pipelined_pp_step_is_pp_times_the_slowest_stage() -> None:
    # two identical prompts on two balanced stages: stage 0 runs prompt B while stage 1 runs
    # prompt A, so the step costs what ONE prompt costs unpipelined (the sum of two stages)
    cm = cost_model(M70, "A100-80GB", 4, 2)
    pipe = PipelineCost(cm)
    one = cm.prefill_time([2048])
    two = cm.prefill_time([2048, 2048])
    assert two == pytest.approx(2 * one, rel=0.01)
    assert pipe.prefill_time([2048, 2048]) == pytest.approx(one, rel=1e-3)
    # an unbalanced split: the slow stage decides, pp x its micro-batch time
    g = get_gpu("A100-80GB")
    model = get_model(M70)
    link = Link(300e9, 0.0)
    dep = Deployment(model, (Stage(g, 4, 60), Stage(g, 4, 20)), pp_link=link)
    pipe = PipelineCost(cost_model_for(dep))
    big = pipe.prefill_time([1024, 1024])
    s0 = pipe.stages[0]
    stage0 = (s0.prefill_time([1024]) - s0.step_overhead_s - s0.head_time(1)
              + 1024 * model.hidden * 2 / 300e9)
    assert big == pytest.approx(2 * stage0 + cost_model_for(dep).step_overhead_s, rel=1e-6)


def test_pipelined_decode_beats_serial_stages_on_kv_heavy_batches() -> None:
    cm = cost_model(M70, "A100-80GB", 4, 2)
    pipe = PipelineCost(cm)
    b, ctx = 64, 64 * 4000
    serial = cm.decode_step_time(b, ctx)
    piped = pipe.decode_step_time(b, ctx)
    assert serial / 2 < piped < serial
    a, g = pipe.decode_coeffs(b, ctx)
    assert piped == pytest.approx(a + g * ctx)


def test_pp_microbatch_raises_saturated_throughput_not_isolated_latency() -> None:
    single = poisson(0.05, 40, 2048, 64, seed=1)
    loaded = poisson(6, 40, 2048, 256, seed=1)
    off = EngineConfig()
    on = EngineConfig(pp_microbatch=True)
    a = simulate_replica(M70, "A100-80GB", 4, single, pp=2, config=off)
    b = simulate_replica(M70, "A100-80GB", 4, single, pp=2, config=on)
    assert b.mean_ttft_s == pytest.approx(a.mean_ttft_s, rel=1e-6)
    a = simulate_replica(M70, "A100-80GB", 4, loaded, pp=2, config=off)
    b = simulate_replica(M70, "A100-80GB", 4, loaded, pp=2, config=on)
    assert b.n_completed == a.n_completed == len(loaded)
    assert b.mean_e2e_s < a.mean_e2e_s
    chunked = simulate_replica(M70, "A100-80GB", 4, loaded, pp=2,
                               config=EngineConfig(pp_microbatch=True, chunked_prefill=True))
    assert chunked.n_completed == len(loaded)


def _replica(role: str, n: int, handoffs: list[tuple[int, float, int]],
             max_num_seqs: int = 1) -> tuple[Replica, RequestBook]:
    book = RequestBook([0.0] * n, [1000] * n, [20] * n)
    cost = cost_model("llama-3.1-8b", "H100", 1, 1)
    rep = Replica(0, cost, EngineConfig(max_num_seqs=max_num_seqs), 100_000, book,
                  role,  # type: ignore[arg-type]
                  lambda rid, t, ctx: handoffs.append((rid, t, ctx)))
    return rep, book


def test_role_flip_mid_run_is_drain_free() -> None:
    handoffs: list[tuple[int, float, int]] = []
    rep, book = _replica("prefill", 4, handoffs)
    cost = rep.cost
    step = cost.prefill_time([1000])
    for rid in range(3):
        rep.submit(rid, 1000, 20)
    rep.set_role("decode", at_t=0.5 * step)  # runs r0's prefill (one seat per step)
    assert rep.role == "decode" and [h[0] for h in handoffs] == [0]
    assert rep.now == pytest.approx(step)
    rep.submit(3, 1000, 20, kv_ready=True)  # arrives under the new role
    rep.drain()
    # r1, r2 arrived as prefill work: prefilled and handed off, never decoded here
    assert [h[0] for h in handoffs] == [0, 1, 2]
    assert [h[2] for h in handoffs] == [1000, 1000, 1000]
    assert book.finish[1] == pytest.approx(2 * step) and book.finish[2] == pytest.approx(3 * step)
    # r3 decodes its 19 remaining tokens after r2's prefill step, without prefill compute
    assert math.isnan(book.first_token[3])
    dec = sum(cost.decode_step_time(1, 1000 + i) for i in range(19))
    assert book.finish[3] == pytest.approx(3 * step + dec, rel=1e-6)


def test_role_flip_decode_to_prefill_finishes_running_decodes() -> None:
    handoffs: list[tuple[int, float, int]] = []
    rep, book = _replica("decode", 3, handoffs, max_num_seqs=8)
    rep.submit(0, 1000, 20, kv_ready=True)
    rep.advance_to(0.01)  # r0 is decoding
    assert rep.running
    rep.set_role("prefill", at_t=0.01)
    rep.submit(1, 1000, 20)
    rep.drain()
    assert [h[0] for h in handoffs] == [1]  # only the new request is handed off
    assert not math.isnan(book.finish[0]) and book.finish[0] > book.finish[1] - 1.0
    with pytest.raises(Exception, match="role"):
        rep.set_role("sideways")  # type: ignore[arg-type]


def test_pause_freezes_progress_and_resume_continues() -> None:
    handoffs: list[tuple[int, float, int]] = []
    ref, ref_book = _replica("both", 2, handoffs, max_num_seqs=8)
    rep, book = _replica("both", 2, handoffs, max_num_seqs=8)
    for r in (ref, rep):
        r.submit(0, 1000, 20)
        r.submit(1, 1000, 20)
    ref.drain()
    rep.pause(at_t=0.0)
    rep.advance_to(5.0)
    assert rep.now == 5.0 and math.isnan(book.first_token[0]) and rep.outstanding == 2
    rep.drain()  # paused: nothing runs
    assert math.isnan(book.finish[0])
    rep.resume(at_t=6.0)
    rep.drain()
    for rid in (0, 1):
        assert book.finish[rid] == pytest.approx(ref_book.finish[rid] + 6.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(0, 8000), st.sampled_from([(4, 2), (2, 4), (8, 2)]))
def test_pipelining_never_beats_perfect_overlap(batch: int, mean_ctx: int,
                                                layout: tuple[int, int]) -> None:
    # every stage still does all its work (weights read once per micro-batch), so a step is
    # at least the serial step / PP, and one micro-batch is never faster than serial
    tp, pp = layout
    cm = cost_model(M70, "H100", tp, pp)
    pipe = PipelineCost(cm)
    serial = cm.decode_step_time(batch, batch * mean_ctx)
    piped = pipe.decode_step_time(batch, batch * mean_ctx)
    assert piped >= serial / pp * (1 - 1e-9)
    if batch == 1:
        assert piped == pytest.approx(serial, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 12), st.floats(0.0, 2.0), st.booleans())
def test_role_flip_loses_and_duplicates_nothing(n_before: int, n_after: int, flip_t: float,
                                                chunked: bool) -> None:
    # prefill -> decode: everything that arrived before the flip is handed off exactly once,
    # everything after (KV already here) is decoded here to the end
    n = n_before + n_after
    handoffs: list[tuple[int, float, int]] = []
    book = RequestBook([0.0] * n, [800] * n, [12] * n)
    rep = Replica(0, cost_model("llama-3.1-8b", "H100", 1, 1),
                  EngineConfig(max_num_seqs=4, chunked_prefill=chunked,
                               max_batched_tokens=1024),
                  50_000, book, "prefill", lambda rid, t, ctx: handoffs.append((rid, t, ctx)))
    for rid in range(n_before):
        rep.submit(rid, 800, 12)
    rep.set_role("decode", at_t=flip_t)
    for rid in range(n_before, n):
        rep.submit(rid, 800, 12, kv_ready=True)
    rep.drain()
    assert sorted(h[0] for h in handoffs) == list(range(n_before))
    for rid in range(n_before, n):
        assert not math.isnan(book.finish[rid]) and not book.truncated[rid]
    assert rep.outstanding == 0 and not rep._old_role
