"""ThunderServe planner: routing LP, moves, Algorithm 2 configs, tabu determinism, and the
analytic evaluator ranking plans as the discrete-event simulator does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmfabric import sim
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.phasesplit.config import ConfigSearch
from llmfabric.scheduler.phasesplit.evaluate import evaluate_groups, simulate
from llmfabric.scheduler.phasesplit.groups import (
    early_ok,
    initial_solution,
    neighbour,
    solution_key,
)
from llmfabric.scheduler.phasesplit.orchestrate import solve_routing
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances

pytestmark = pytest.mark.unit

MODEL = sim.get_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def cluster() -> CloudCluster:
    topo = cloud_instances([("A40", 4), ("RTX-3090-Ti", 4), ("RTX-A5000", 4),
                            ("RTX-A6000", 2)], inter_gbps=(1, 10), seed=1)
    return CloudCluster.from_topology(topo)


def _workload(rate: float = 30.0, ttft: float = 1.5) -> PDWorkload:
    return PDWorkload.from_means(rate, 1000, 100, slo=sim.SLO(ttft_s=ttft, tpot_s=0.05))


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(v: list[float]) -> np.ndarray:
        arr = np.asarray(v)
        r = np.empty(len(arr))
        r[np.argsort(arr, kind="stable")] = np.arange(len(arr))
        for u in np.unique(arr):
            r[arr == u] = r[arr == u].mean()
        return r
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


# ---- routing LP ----

def test_lp_prefers_good_pairs_within_capacities():
    d = np.array([[1.0, 0.2], [0.5, 0.9]])
    r = solve_routing(d, a=[5, 5], b=[5, 5], rate=8)
    assert r.unserved == pytest.approx(0.0, abs=1e-9)
    assert 8 * r.z == pytest.approx(np.array([[5, 0], [0, 3]]), abs=1e-6)
    assert r.attainment == pytest.approx((5 * 1.0 + 3 * 0.9) / 8, abs=1e-6)
    assert r.x.sum() == pytest.approx(1.0)
    assert r.y.sum(axis=1) == pytest.approx([1.0, 1.0])


def test_lp_leaves_load_unserved_beyond_capacity():
    r = solve_routing(np.ones((1, 1)), a=[2], b=[10], rate=8)
    assert r.unserved == pytest.approx(0.75)
    assert r.attainment == pytest.approx(0.25)


@pytest.mark.parametrize("d,a,b,rate", [
    (np.ones((2, 2)), [1], [1, 1], 1.0), (np.full((1, 1), np.nan), [1], [1], 1.0),
    (np.ones((1, 1)), [-1], [1], 1.0), (np.ones((1, 1)), [1], [1], 0.0),
])
def test_lp_refuses_bad_inputs(d, a, b, rate):
    with pytest.raises(SpecError):
        solve_routing(d, a, b, rate)


# ---- groups and moves ----

def test_moves_keep_a_partition_of_the_gpus(cluster):
    cs = ConfigSearch(cluster, MODEL, _workload())

    def feasible(g, p):
        return cs.deduce(g, p) is not None

    rng = np.random.default_rng(3)
    sol = initial_solution(cluster, feasible, rng)
    # the clustering start follows the instances (highest intra-instance bandwidth)
    assert all(len({cluster.gpus[i].host for i in g.gpus}) == 1 for g in sol)
    every = set(range(len(cluster.gpus)))
    applied = 0
    for _ in range(200):
        _, cand = neighbour(sol, cluster, rng)
        if cand is None or not early_ok(cand, feasible):
            continue
        ids = [i for g in cand for i in g.gpus]
        assert sorted(ids) == sorted(every)            # disjoint and complete
        assert {"prefill", "decode"} <= {g.phase for g in cand}
        sol, applied = cand, applied + 1
    assert applied > 20


def test_configs_keep_tp_inside_one_host_and_type_and_split_all_layers(cluster):
    cs = ConfigSearch(cluster, MODEL, _workload())
    for ids in (range(0, 4), range(4, 8), range(0, 8), range(8, 14)):
        for phase in ("prefill", "decode"):
            cfg = cs.deduce(frozenset(ids), phase)
            assert cfg is not None
            used: list[int] = []
            for rep in cfg.replica_configs:
                assert sum(s.layers for s in rep.stages) == MODEL.n_layers
                for s in rep.stages:
                    assert len(s.gpus) == cfg.tp
                    assert len({cluster.gpus[i].host for i in s.gpus}) == 1
                    assert {cluster.gpus[i].type for i in s.gpus} == {s.type}
                    used += s.gpus
            assert len(used) == len(set(used)) and set(used) <= set(ids)
            assert all(r.kv_capacity_tokens > 0 for r in cfg.replica_configs)


def test_a_group_too_small_for_the_model_has_no_config(cluster):
    cs = ConfigSearch(cluster, sim.get_model("llama-3.1-70b"), _workload())
    assert cs.deduce(frozenset([4]), "decode") is None


# ---- tabu ----

def test_tabu_is_deterministic_for_a_seed_and_never_loses_its_best(cluster):
    opts = TabuOptions(n_step=6, n_neigh=4, seed=7)
    a = tabu_search(cluster, MODEL, _workload(), opts).to_json()
    b = tabu_search(cluster, MODEL, _workload(), opts).to_json()
    for doc in (a, b):
        doc.pop("solve_s")
    assert a == b
    trace = a["search_trace"]
    assert trace == sorted(trace)
    assert a["attainment"] == pytest.approx(trace[-1])
    assert a["n_prefill"] >= 1 and a["n_decode"] >= 1
    json.dumps(a)


def test_the_plan_runs_in_the_simulator(cluster):
    plan = tabu_search(cluster, MODEL, _workload(), TabuOptions(n_step=3, n_neigh=3))
    pre, dec, routing, links = plan.to_replica_specs()
    assert (len(pre), len(dec)) == routing.shape == links.shape
    score = plan.evaluate(duration_s=30)
    assert 0 <= score.attainment <= 1 and score.throughput_rps > 0


def test_analytic_and_simulated_attainment_rank_20_plans_alike(cluster):
    wl = _workload()
    cs = ConfigSearch(cluster, MODEL, wl)

    def feasible(g, p):
        return cs.deduce(g, p) is not None

    rng = np.random.default_rng(0)
    sol = initial_solution(cluster, feasible, rng)
    plans = {}
    while len(plans) < 20:
        _, cand = neighbour(sol, cluster, rng)
        if cand is None or not early_ok(cand, feasible):
            continue
        sol = cand
        if rng.uniform() < 0.3:
            plans[solution_key(cand)] = cand
    analytic, simulated = [], []
    for p in plans.values():
        ev = evaluate_groups(p, cs, cluster, MODEL, wl, kv_bits=4, kv_group=64)
        assert ev is not None
        analytic.append(ev.attainment)
        simulated.append(simulate(ev.prefill, ev.decode, ev.routing, cluster, wl, kv_bits=4,
                                  kv_group=64, duration_s=60).attainment)
    assert max(simulated) - min(simulated) > 0.3   # the plans differ
    assert _spearman(analytic, simulated) >= 0.8


def test_workload_and_options_refuse_nonsense():
    with pytest.raises(SpecError):
        PDWorkload(0.0, np.array([1]), np.array([1]))
    with pytest.raises(SpecError):
        PDWorkload(1.0, np.array([1, 2]), np.array([1]))
    with pytest.raises(SpecError):
        PDWorkload(1.0, np.array([0]), np.array([1]))
    with pytest.raises(SpecError):
        TabuOptions(evaluator="magic")
    with pytest.raises(SpecError):
        TabuOptions(move_weights=(0, 0, 0, 0))
