"""The simulator for the final plan (TabuOptions.final_sim_top): the analytic top-k and the
start re-scored by the discrete-event simulator; never worse than the start there."""

from __future__ import annotations

import pytest

from llmfabric import sim
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.evaluate import simulate
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances


def test_final_sim_pick_is_no_worse_than_the_start_and_deterministic() -> None:
    topo = cloud_instances([("A40", 2), ("RTX-3090-Ti", 2), ("RTX-A5000", 2)],
                           inter_gbps=(5, 40), seed=3)
    cluster = CloudCluster.from_topology(topo)
    wl = PDWorkload.from_means(6, 800, 120, slo=sim.SLO(ttft_s=1.5, tpot_s=0.08))
    start = tabu_search(cluster, "llama-3.1-8b", wl, TabuOptions(n_step=0))
    opts = TabuOptions(n_step=4, final_sim_top=3, final_sim_s=30.0)
    a = tabu_search(cluster, "llama-3.1-8b", wl, opts)
    b = tabu_search(cluster, "llama-3.1-8b", wl, opts)
    assert a.plan_id == b.plan_id

    def judged(p):  # type: ignore[no-untyped-def]
        return simulate(p.replicas("prefill"), p.replicas("decode"), p.routing, cluster, wl,
                        kv_bits=p.kv_bits, kv_group=p.kv_group, duration_s=30.0,
                        seed=1).attainment

    assert judged(a) >= judged(start) - 1e-12
    with pytest.raises(SpecError):
        TabuOptions(final_sim_top=-1)
