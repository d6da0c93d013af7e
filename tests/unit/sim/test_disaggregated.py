"""simulate_disaggregated with a LinkMatrix, PDRouting (smooth weighted round robin), link
contention, per-stage links, and the loud error for replicas that cannot hold one request."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import (
    EngineConfig,
    InfeasibleError,
    Link,
    ReplicaSpec,
    SpecError,
    get_model,
    poisson,
    replay,
    simulate_cluster,
    simulate_disaggregated,
)
from llmfabric.sim.costs import cost_model
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.parallel import kv_transfer_time, kv_transfer_time_staged, make_deployment
from llmfabric.sim.pdrouting import PDRouting, SmoothWRR

M = "llama-3.1-8b"


def test_pdrouting_follows_weights_over_300_requests() -> None:
    x = [0.5, 0.3, 0.2]
    y = [[0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25]]
    router = PDRouting(x, y).start(seed=7)
    pairs = np.zeros((3, 4), dtype=int)
    for _ in range(300):
        i = router.prefill()
        pairs[i, router.decode(i)] += 1
    rows = pairs.sum(axis=1)
    assert np.all(np.abs(rows - 300 * np.array(x)) <= 1)
    for i in range(3):
        assert np.all(np.abs(pairs[i] - rows[i] * np.array(y[i])) <= 1)
    assert pairs[0, 2] == pairs[0, 3] == pairs[1, 0] == 0  # zero weights never picked
    # deterministic per seed
    again = PDRouting(x, y).start(seed=7)
    first = [again.prefill() for _ in range(20)]
    again2 = PDRouting(x, y).start(seed=7)
    assert first == [again2.prefill() for _ in range(20)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 50), min_size=1, max_size=8), st.integers(1, 400),
       st.integers(0, 5))
def test_smooth_wrr_stays_within_one_pick_of_its_share(weights: list[float], n: int,
                                                       seed: int) -> None:
    if sum(weights) <= 0:
        with pytest.raises(SpecError):
            SmoothWRR(weights)
        return
    wrr = SmoothWRR(weights, seed)
    counts = np.bincount([wrr.pick() for _ in range(n)], minlength=len(weights))
    share = n * np.array(weights) / sum(weights)
    assert np.all(np.abs(counts - share) <= 1 + 1e-9)


def test_pdrouting_validation() -> None:
    with pytest.raises(SpecError):
        PDRouting([1.0], [[1.0], [1.0]])
    with pytest.raises(SpecError):
        PDRouting([1.0, 1.0], [[1.0], [0.0]])  # traffic to prefill 1, nowhere to go
    PDRouting([1.0, 0.0], [[1.0], [0.0]])  # no traffic: fine
    with pytest.raises(SpecError):
        PDRouting([-1.0], [[1.0]])
    with pytest.raises(SpecError):
        PDRouting([1.0], [[float("nan")]])


def _single_request_finish(link: Link, ctx: int = 2000, out: int = 20) -> float:
    cm = cost_model(M, "H100")
    return (cm.prefill_time([ctx]) + kv_transfer_time(get_model(M), ctx, link)
            + sum(cm.decode_step_time(1, ctx + i) for i in range(out - 1)))


def test_link_matrix_pairs_and_hand_computed_handoff() -> None:
    wl = replay([(0.0, 2000, 20)])
    pre = [ReplicaSpec.of(M, "H100")]
    dec = [ReplicaSpec.of(M, "H100"), ReplicaSpec.of(M, "H100")]
    fast, slow = Link(50e9, 1e-5), Link(0.5e9, 5e-3)
    matrix = LinkMatrix([[fast.bandwidth, slow.bandwidth]], [[fast.latency_s, slow.latency_s]])
    to_fast = simulate_disaggregated(pre, dec, wl, matrix, routing=PDRouting([1], [[1, 0]]))
    to_slow = simulate_disaggregated(pre, dec, wl, matrix, routing=PDRouting([1], [[0, 1]]))
    assert to_fast.replica[0] == 1 and to_slow.replica[0] == 2
    assert to_fast.e2e_s[0] == pytest.approx(_single_request_finish(fast), rel=1e-9)
    assert to_slow.e2e_s[0] == pytest.approx(_single_request_finish(slow), rel=1e-9)
    assert to_fast.ttft_s[0] == to_slow.ttft_s[0]
    # a router picks per pair too (here: least outstanding = power of two choices)
    res = simulate_disaggregated(pre, dec, poisson(5, 10, 1000, 50, seed=2), matrix)
    assert res.n_completed == res.n_requests
    with pytest.raises(SpecError, match="LinkMatrix"):
        simulate_disaggregated(pre, dec, wl, LinkMatrix([[1e9]]))
    with pytest.raises(SpecError, match="PDRouting"):
        simulate_disaggregated(pre, dec, wl, fast, routing=PDRouting([1], [[1]]))


def test_quantized_transfer_counts_metadata() -> None:
    wl = replay([(0.0, 2000, 20)])
    pre, dec = [ReplicaSpec.of(M, "H100")], [ReplicaSpec.of(M, "H100")]
    link = Link(1e9, 0.0)
    full = simulate_disaggregated(pre, dec, wl, link)
    q4 = simulate_disaggregated(pre, dec, wl, link, kv_bits=4)
    q4g32 = simulate_disaggregated(pre, dec, wl, link, kv_bits=4, kv_group=32)
    t16 = kv_transfer_time(get_model(M), 2000, link)
    assert full.e2e_s[0] - q4.e2e_s[0] == pytest.approx(t16 * (1 - 4.5 / 16), rel=1e-6)
    assert q4g32.e2e_s[0] - q4.e2e_s[0] == pytest.approx(t16 * (5 - 4.5) / 16, rel=1e-6)


def test_link_contention_serializes_transfers_fifo() -> None:
    # two prompts at t=0 on two prefill replicas finish together; one decode replica, one link
    wl = replay([(0.0, 2000, 2), (0.0, 2000, 2)])
    pre = [ReplicaSpec.of(M, "H100")] * 2
    dec = [ReplicaSpec.of(M, "H100", config=EngineConfig(max_num_seqs=1))]
    link = Link(1e9, 1e-3)
    routing = PDRouting([1, 1], [[1], [1]])
    free = simulate_disaggregated(pre, dec, wl, link, routing=routing)
    busy = simulate_disaggregated(pre, dec, wl, link, routing=routing, link_contention=True)
    t_kv = kv_transfer_time(get_model(M), 2000, link)
    cm = cost_model(M, "H100")
    step = cm.decode_step_time(1, 2000)
    ready = cm.prefill_time([2000])
    # without contention both arrive at ready + T and the one-seat decoder runs them in turn
    assert sorted(free.e2e_s) == pytest.approx([ready + t_kv + step, ready + t_kv + 2 * step])
    # with contention the second transfer starts when the first ends
    assert sorted(busy.e2e_s) == pytest.approx([ready + t_kv + step, ready + 2 * t_kv + step])
    # a LinkMatrix: different pairs are different links, no queueing between them
    dec2 = [dec[0], dec[0]]
    matrix = LinkMatrix.uniform(link, 2, 2)
    split = simulate_disaggregated(pre, dec2, wl, matrix, routing=PDRouting(
        [1, 1], [[1, 0], [0, 1]]), link_contention=True)
    assert split.e2e_s == pytest.approx([ready + t_kv + step] * 2)


def test_stage_links_use_the_staged_transfer() -> None:
    m70 = get_model("llama-3.1-70b")
    pre = [ReplicaSpec(make_deployment(m70, "A100-80GB", 4, 2))]
    dec = [ReplicaSpec(make_deployment(m70, "A100-80GB", 4, 2))]
    wl = replay([(0.0, 1000, 10)])
    local, wan = Link(20e9, 1e-5), Link(1e9, 1e-3)

    def stage_link(i: int, j: int, sp: int, sd: int) -> Link:
        return local if sp == sd else wan

    whole = simulate_disaggregated(pre, dec, wl, wan)
    staged = simulate_disaggregated(pre, dec, wl, wan, stage_link=stage_link)
    expect = kv_transfer_time_staged(pre[0].deployment, dec[0].deployment, 1000,
                                     lambda sp, sd: stage_link(0, 0, sp, sd))
    assert whole.e2e_s[0] - staged.e2e_s[0] == pytest.approx(
        kv_transfer_time(m70, 1000, wan) - expect, rel=1e-6)


def test_a_replica_that_cannot_hold_one_request_is_an_error() -> None:
    wl = replay([(0.0, 3000, 100), (1.0, 2000, 100)])
    tiny = ReplicaSpec.of(M, "H100", config=EngineConfig(kv_capacity_tokens=1024))
    ok = ReplicaSpec.of(M, "H100")
    with pytest.raises(InfeasibleError, match="complete nothing"):
        simulate_cluster([ok, tiny], wl)
    with pytest.raises(InfeasibleError, match="prompt"):
        simulate_disaggregated([tiny], [ok], wl, Link(1e9, 0))
    with pytest.raises(InfeasibleError, match="request"):
        simulate_disaggregated([ok], [tiny], wl, Link(1e9, 0))
    # holding the smallest request is enough: the larger one is truncated, not an error
    mid = ReplicaSpec.of(M, "H100", config=EngineConfig(kv_capacity_tokens=2400))
    res = simulate_cluster([mid], wl)
    assert res.n_completed == 1


def test_cloud_topology_to_plan_run_end_to_end() -> None:
    # ThunderServe's sim mode in small: GPUs of a seeded cloud, replicas as GPU groups, the
    # GPU-pair matrix reduced to replica pairs, fixed routing, 4-bit KV, contention on
    from llmfabric.sim.topology import cloud_instances

    cloud = cloud_instances([("A40", 2), ("A40", 2), ("RTX-A6000", 2)], seed=1)
    gpu_links = LinkMatrix.from_topology(cloud)
    prefill_groups = [[0, 1]]
    decode_groups = [[2, 3], [4, 5]]  # both on other instances: WAN links of different speed
    links = gpu_links.reduce(prefill_groups, decode_groups)
    assert links[0, 0].bandwidth != links[0, 1].bandwidth
    fast_j = int(np.argmax([links[0, j].bandwidth for j in range(2)]))
    pre = [ReplicaSpec.of(M, "A40", 2)]
    dec = [ReplicaSpec.of(M, "A40", 2)] * 2  # the same decoders: only the link differs
    wl = poisson(3, 40, 1500, 60, seed=4)
    to = [[0.0, 0.0]]
    to[0][fast_j] = 1.0
    fast = simulate_disaggregated(pre, dec, wl, links, routing=PDRouting([1], to), kv_bits=4)
    to = [[0.0, 0.0]]
    to[0][1 - fast_j] = 1.0
    slow = simulate_disaggregated(pre, dec, wl, links, routing=PDRouting([1], to), kv_bits=4)
    assert fast.n_completed == slow.n_completed == len(wl)
    gap = kv_transfer_time(get_model(M), 1500, links[0, 1 - fast_j], 4) - kv_transfer_time(
        get_model(M), 1500, links[0, fast_j], 4)
    assert gap > 0
    # every KV arrives `gap` later, so the decoder sees the same stream shifted by gap
    assert slow.e2e_s - fast.e2e_s == pytest.approx(np.full(len(wl), gap), rel=1e-6)
    busy = simulate_disaggregated(pre, dec, wl, links, routing=PDRouting([1], [[1, 1]]),
                                  kv_bits=4, link_contention=True)
    free = simulate_disaggregated(pre, dec, wl, links, routing=PDRouting([1], [[1, 1]]),
                                  kv_bits=4)
    assert busy.mean_e2e_s >= free.mean_e2e_s
    assert busy.mean_ttft_s == free.mean_ttft_s  # contention is after the first token
