"""The analytic pair model agrees with the simulator's own formulas; hostile plan inputs
raise SpecError only."""

from __future__ import annotations

import numpy as np
import pytest

from llmfabric import sim
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.config import ConfigSearch
from llmfabric.scheduler.phasesplit.inputs import load_cluster, load_gpus, load_workload
from llmfabric.scheduler.phasesplit.orchestrate import MAX_UTILIZATION, PairModel
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances

pytestmark = pytest.mark.unit
MODEL = sim.get_model("llama-30b")


@pytest.fixture(scope="module")
def setup():
    cluster = CloudCluster.from_topology(cloud_instances(
        [("A40", 8), ("RTX-3090-Ti", 4), ("RTX-A6000", 4)], inter_gbps=(5, 40), seed=3))
    wl = PDWorkload.from_means(4, 1000, 100, slo=sim.SLO(ttft_s=2, tpot_s=0.08))
    cs = ConfigSearch(cluster, MODEL, wl)
    pre = cs.deduce(frozenset(range(0, 8)), "prefill")
    dec = cs.deduce(frozenset(range(8, 12)), "decode")
    assert pre is not None and dec is not None
    return cluster, wl, pre, dec


def test_kv_transfer_matches_the_simulators_staged_formula(setup):
    cluster, wl, pre, dec = setup
    pm = PairModel(pre.replica_configs, dec.replica_configs, cluster, MODEL, wl, 4, 64)
    p, q = pre.replica_configs[0], dec.replica_configs[0]
    for s, n in enumerate(wl.in_lengths[:5]):
        want = sim.kv_transfer_time_staged(
            p.deployment, q.deployment, int(n),
            lambda a, b: cluster.link(p.stages[a].gpus, q.stages[b].gpus), bits=4, group=64)
        assert pm.kv_s[0, 0, s] == pytest.approx(want, rel=1e-9)


def test_decode_capacity_is_the_largest_batch_meeting_the_tpot_deadline(setup):
    cluster, wl, pre, dec = setup
    r = dec.replica_configs[0]
    ctx = wl.mean_in + wl.mean_out / 2
    deadline = (r.decode_step_time(2, ctx) + r.decode_step_time(3, ctx)) / 2
    wl = PDWorkload(wl.rate, wl.in_lengths, wl.out_lengths, sim.SLO(ttft_s=2, tpot_s=deadline))
    pm = PairModel(pre.replica_configs, dec.replica_configs, cluster, MODEL, wl, 4, 64)
    ok = [k for k in range(1, pm.b_max(0) + 1)
          if r.decode_step_time(k, pm.ctx) <= wl.slo.tpot_s]
    assert ok[-1] == 2 < pm.b_max(0)   # the deadline, not memory, binds here
    k = ok[-1]
    want = MAX_UTILIZATION * k / r.decode_step_time(k, pm.ctx) / wl.mean_out
    assert pm.b[0] == pytest.approx(want)
    # and a looser deadline never lowers it
    loose = PDWorkload(wl.rate, wl.in_lengths, wl.out_lengths, sim.SLO(ttft_s=2, tpot_s=1))
    pm2 = PairModel(pre.replica_configs, dec.replica_configs, cluster, MODEL, loose, 4, 64)
    assert pm2.b[0] >= pm.b[0]


def test_more_load_never_raises_attainment(setup):
    cluster, wl, pre, dec = setup
    pm = PairModel(pre.replica_configs, dec.replica_configs, cluster, MODEL, wl, 4, 64)
    m, n = len(pre.replica_configs), len(dec.replica_configs)
    prev = None
    for rate in (0.5, 2, 4, 8, 16, 64):
        d = pm.attainment(np.full(m, rate / m), np.full(n, rate / n))
        assert np.all((d >= 0) & (d <= 1))
        if prev is not None:
            assert np.all(d <= prev + 1e-12)
        prev = d
    assert np.all(prev == 0)   # far past capacity nothing meets the SLO


def test_analytic_evaluate_reproduces_the_plan_score(setup):
    cluster, wl, _, _ = setup
    plan = tabu_search(cluster, MODEL, wl, TabuOptions(n_step=2, n_neigh=3))
    assert plan.evaluate(evaluator="analytic").attainment == pytest.approx(plan.attainment)


@pytest.mark.parametrize("text", [
    "", "instances: 3", "instances: []", "instances: [{gpu: A40}]",
    "instances: [{gpu: A40, count: 0}]", "instances: [{gpu: A40, count: true}]",
    "instances: [{gpu: A40, count: 2, host: a}, {gpu: A40, count: 2, host: a}]",
    "instances: [{gpu: Nope, count: 2}]", "instances: [7]", "{{{",
])
def test_hostile_cluster_yaml(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(SpecError):
        load_gpus(f)


@pytest.mark.parametrize("text", [
    "rate: 0\nmean_in: 10\nmean_out: 10", "rate: x\nmean_in: 10\nmean_out: 10",
    "rate: 1\nmean_in: 0\nmean_out: 10", "rate: 1\nmean_in: 10",
    "rate: 1\nmean_in: 10\nmean_out: 10\nslo: {ttft_s: -1}",
    "rate: 1\nmean_in: 10\nmean_out: 10\nslo: 5", "rate: .nan\nmean_in: 10\nmean_out: 10",
    "rate: 1\nmean_in: 10\nmean_out: 10\nsamples: 0", "- 1",
])
def test_hostile_workload_yaml(tmp_path, text):
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(SpecError):
        load_workload(f)


def test_cluster_needs_links_or_a_topology(tmp_path):
    with pytest.raises(SpecError):
        load_cluster(None, None, None)
    f = tmp_path / "t.yaml"
    f.write_text("nodes: 5")
    with pytest.raises(SpecError):
        load_cluster(None, None, f)


def test_a_saved_plan_round_trips(setup):
    from llmfabric.scheduler.phasesplit.plan import plan_from_json

    cluster, wl, _, _ = setup
    plan = tabu_search(cluster, MODEL, wl, TabuOptions(n_step=2, n_neigh=3))
    back = plan_from_json(plan.to_json(), cluster, workload=wl)
    assert back.to_json()["groups"] == plan.to_json()["groups"]
    assert back.evaluate(evaluator="analytic").attainment == pytest.approx(
        plan.evaluate(evaluator="analytic").attainment)
    broken = plan.to_json()
    broken["groups"][0]["stages"][0][0]["type"] = "H100"
    # the loader's own message, not wrapped as "not a saved PD plan: SpecError('...')"
    with pytest.raises(SpecError, match=r"^stage GPUs \[.*\] are not H100"):
        plan_from_json(broken, cluster)
    with pytest.raises(SpecError):
        plan_from_json({"model": "llama-30b"}, cluster)
