"""Discrete-event serving: conservation, queueing, preemption, routers, disaggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmfabric.sim import (
    SLO,
    EngineConfig,
    InfeasibleError,
    Link,
    ReplicaSpec,
    cost_model,
    gamma,
    max_sustainable_rate,
    on_off,
    poisson,
    replay,
    simulate_closed_loop,
    simulate_cluster,
    simulate_disaggregated,
    simulate_replica,
)
from llmfabric.sim.routers import ROUTERS

M = "llama-3.1-8b"


def test_single_request_matches_cost_model() -> None:
    wl = replay([(0.0, 512, 5)])
    res = simulate_replica(M, "H100", 1, wl)
    cm = cost_model(M, "H100")
    ttft = cm.prefill_time([512])
    decode = sum(cm.decode_step_time(1, 512 + i) for i in range(4))
    assert res.ttft_s[0] == pytest.approx(ttft)
    assert res.e2e_s[0] == pytest.approx(ttft + decode)
    assert res.tpot_s[0] == pytest.approx(decode / 4)


def test_all_requests_complete_and_metrics_consistent() -> None:
    wl = poisson(5, 60, 512, 128, seed=3)
    res = simulate_replica(M, "A100", 1, wl, slo=SLO(ttft_s=2.0, tpot_s=0.1))
    assert res.n_completed == len(wl) and res.n_rejected == 0
    assert np.all(res.ttft_s > 0) and np.all(res.e2e_s >= res.ttft_s)
    assert 0.0 <= res.slo_attainment <= 1.0
    assert res.throughput_rps == pytest.approx(5, rel=0.2)
    assert res.utilisation.busy_fraction.max() <= 1.0
    assert 0 < res.utilisation.busy_fraction.mean() < 1


def test_queueing_grows_with_load() -> None:
    ttfts = []
    for rate in (2, 8, 16, 32):
        wl = poisson(rate, 60, 1024, 256, seed=1)
        ttfts.append(simulate_replica(M, "A100", 1, wl).mean_e2e_s)
    assert ttfts == sorted(ttfts)
    assert ttfts[-1] > 2 * ttfts[0]


def test_preemption_when_kv_runs_out() -> None:
    cfg = EngineConfig(kv_capacity_tokens=4096)
    wl = poisson(50, 5, 512, 512, seed=0)
    res = simulate_replica(M, "H100", 1, wl, config=cfg)
    assert res.preemptions > 0
    assert res.n_completed == len(wl)
    roomy = simulate_replica(M, "H100", 1, wl)
    assert roomy.preemptions == 0


def test_chunked_prefill_completes_and_smooths_tpot() -> None:
    wl = poisson(20, 30, 2048, 128, seed=2)
    plain = simulate_replica(M, "H100", 1, wl)
    chunked = simulate_replica(M, "H100", 1, wl,
                               config=EngineConfig(chunked_prefill=True, max_batched_tokens=512))
    assert chunked.n_completed == plain.n_completed == len(wl)
    assert chunked.p99_tpot_s < plain.p99_tpot_s


def test_max_num_seqs_limits_batch() -> None:
    wl = replay([(0.0, 16, 100)] * 8)
    one = simulate_replica(M, "H100", 1, wl, config=EngineConfig(max_num_seqs=1))
    eight = simulate_replica(M, "H100", 1, wl, config=EngineConfig(max_num_seqs=8))
    assert one.mean_e2e_s > 3 * eight.mean_e2e_s


def test_oversized_prompt_is_rejected_not_hung() -> None:
    wl = replay([(0.0, 5000, 10), (0.1, 100, 10)])
    res = simulate_replica(M, "H100", 1, wl, config=EngineConfig(kv_capacity_tokens=4096))
    assert res.n_rejected == 1 and math.isnan(res.e2e_s[0]) and res.e2e_s[1] > 0


def test_infeasible_model_raises() -> None:
    with pytest.raises(InfeasibleError, match="tp"):
        simulate_replica("llama-2-70b", "A100-40GB", 1, replay([(0, 10, 10)]))


def test_arrival_processes() -> None:
    p = poisson(10, 100, seed=1)
    g = gamma(10, 3.0, 100, seed=1)
    o = on_off(20, 1.0, 1.0, 100, seed=1)
    for wl in (p, g, o):
        assert np.all(np.diff(wl.arrival_s) >= 0) and wl.arrival_s.max() < 100
    assert len(p) == pytest.approx(1000, rel=0.15)
    assert len(g) == pytest.approx(1000, rel=0.4)
    gaps_p, gaps_g = np.diff(p.arrival_s), np.diff(g.arrival_s)
    assert gaps_g.std() / gaps_g.mean() > 2 * gaps_p.std() / gaps_p.mean()
    phase = o.arrival_s % 2.0
    assert np.all(phase < 1.0)  # nothing in the off windows


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_cluster_routers_spread_load(router: str) -> None:
    wl = poisson(40, 30, 512, 128, seed=4)
    res = simulate_cluster([ReplicaSpec.of(M, "H100")] * 4, wl, router=router)
    assert res.n_completed == len(wl)
    counts = np.bincount(res.replica, minlength=4)
    assert counts.min() > 0.1 * len(wl)


def test_more_replicas_lower_latency() -> None:
    wl = poisson(30, 30, 1024, 256, seed=5)
    one = simulate_cluster([ReplicaSpec.of(M, "A100")], wl)
    four = simulate_cluster([ReplicaSpec.of(M, "A100")] * 4, wl)
    assert four.mean_e2e_s < one.mean_e2e_s


def test_disaggregated_kv_transfer_costs_and_compression() -> None:
    wl = poisson(4, 30, 2048, 64, seed=6)
    pre = [ReplicaSpec.of(M, "H100")]
    dec = [ReplicaSpec.of(M, "A100")]
    fast = simulate_disaggregated(pre, dec, wl, Link(50e9, 1e-5))
    slow = simulate_disaggregated(pre, dec, wl, Link(1e9, 1e-3))
    slow4 = simulate_disaggregated(pre, dec, wl, Link(1e9, 1e-3), kv_bits=4)
    assert fast.n_completed == slow.n_completed == len(wl)
    assert fast.mean_ttft_s == pytest.approx(slow.mean_ttft_s)  # TTFT is on the prefill side
    assert slow.mean_tpot_s > slow4.mean_tpot_s > fast.mean_tpot_s


def test_max_sustainable_rate_orders_gpus() -> None:
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    h100 = max_sustainable_rate(M, "H100", 1, 512, 128, slo, n_requests=150, iterations=5)
    a40 = max_sustainable_rate(M, "A40", 1, 512, 128, slo, n_requests=150, iterations=5)
    assert h100 > a40 > 0
    tight = max_sustainable_rate(M, "A40", 1, 512, 128, SLO(tpot_s=0.001), n_requests=50)
    assert tight == 0.0


def test_deterministic() -> None:
    wl = gamma(20, 2.0, 20, 512, 128, seed=9)
    a = simulate_cluster([ReplicaSpec.of(M, "H100")] * 3, wl, router="random", seed=1)
    b = simulate_cluster([ReplicaSpec.of(M, "H100")] * 3, wl, router="random", seed=1)
    assert np.array_equal(a.e2e_s, b.e2e_s)


def test_closed_loop_keeps_concurrency_and_batching_pays() -> None:
    one = simulate_closed_loop(M, "A100-40GB", 1, 1, 10, 1024, 64)
    eight = simulate_closed_loop(M, "A100-40GB", 1, 8, 80, 1024, 64)
    assert one.n_completed == 10 and eight.n_completed == 80
    # a client sends its next request only after the previous one finished
    for i in range(1, 10):
        assert one.arrival_s[i] >= one.arrival_s[i - 1] + one.e2e_s[i - 1] - 1e-12
    assert 4 < eight.output_tokens_per_s / one.output_tokens_per_s < 8
    assert eight.mean_tpot_s > one.mean_tpot_s


def test_round_robin_assignment_and_lazy_advance_match_eager() -> None:
    wl = poisson(30, 20, 512, 128, seed=8)
    specs = [ReplicaSpec.of(M, "H100")] * 3
    rr = simulate_cluster(specs, wl, router="round_robin")
    assert np.array_equal(rr.replica, np.arange(len(wl)) % 3)
    # each replica alone on its share of the workload gives the same per-request latency
    for i in range(3):
        share = wl.subset(np.arange(len(wl)) % 3 == i)
        alone = simulate_cluster([specs[i]], share)
        assert np.allclose(alone.e2e_s, rr.e2e_s[rr.replica == i])


def test_mixed_gpu_pipeline_replica_serves() -> None:
    from llmfabric.sim import make_deployment, plan_memory
    from llmfabric.sim.memory import memory_plan

    dep = make_deployment("llama-2-70b", ["H100", "A100-80GB"], tp=[2, 2])
    plan = memory_plan(dep)
    assert plan.fits and plan.kv_capacity_tokens > 0
    assert plan.kv_capacity_tokens != plan_memory("llama-2-70b", "H100", tp=2, pp=2
                                                  ).kv_capacity_tokens
    wl = poisson(2, 10, 512, 64, seed=3)
    res = simulate_cluster([ReplicaSpec(dep)], wl)
    assert res.n_completed == len(wl)
    same = simulate_cluster([ReplicaSpec.of("llama-2-70b", "H100", tp=2, pp=2)], wl)
    assert res.mean_tpot_s > same.mean_tpot_s  # the A100 stage is slower
