"""Laws of the discrete-event engine, checked on random small workloads."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import EngineConfig, ReplicaSpec, cost_model, replay, simulate_cluster

M = "qwen3-1.7b"

requests = st.lists(
    st.tuples(st.floats(0, 20, allow_nan=False), st.integers(1, 3000), st.integers(1, 300)),
    min_size=1, max_size=40,
)
configs = st.builds(
    EngineConfig,
    max_num_seqs=st.integers(1, 64),
    max_batched_tokens=st.sampled_from([512, 2048, 8192]),
    chunked_prefill=st.booleans(),
    kv_capacity_tokens=st.sampled_from([4096, 20000, None]),
)


@settings(max_examples=60, deadline=None)
@given(reqs=requests, config=configs, n_replicas=st.integers(1, 3),
       router=st.sampled_from(["round_robin", "least_outstanding", "least_work"]))
def test_every_request_is_served_causally(reqs: list[tuple[float, int, int]],
                                          config: EngineConfig, n_replicas: int,
                                          router: str) -> None:
    wl = replay(reqs)
    res = simulate_cluster([ReplicaSpec.of(M, "L40S", config=config)] * n_replicas, wl,
                           router=router)
    assert res.n_completed + res.n_rejected == len(wl)
    ok = ~np.isnan(res.e2e_s)
    assert ok.sum() == res.n_completed
    assert np.all(res.ttft_s[ok] > 0)
    assert np.all(res.e2e_s[ok] >= res.ttft_s[ok] - 1e-12)
    # nothing is faster than running alone on an idle replica
    cm = cost_model(M, "L40S")
    for i in np.flatnonzero(ok):
        alone = cm.prefill_time([int(wl.input_tokens[i])])
        assert res.ttft_s[i] >= alone * (1 - 1e-9)
    if config.kv_capacity_tokens is None:
        assert res.n_rejected == 0


@settings(max_examples=25, deadline=None)
@given(reqs=requests)
def test_adding_a_replica_never_hurts_mean_latency_much(reqs: list[tuple[float, int, int]]
                                                        ) -> None:
    wl = replay(reqs)
    one = simulate_cluster([ReplicaSpec.of(M, "L40S")], wl, router="least_outstanding")
    two = simulate_cluster([ReplicaSpec.of(M, "L40S")] * 2, wl, router="least_outstanding")
    assert two.n_completed == one.n_completed == len(wl)
    # batching makes single requests cheaper together, so allow a small margin
    assert two.mean_e2e_s <= one.mean_e2e_s * 1.05
