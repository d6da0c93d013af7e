from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.scheduler.errors import InfeasibleError, SpecError
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.packing import pack
from llmfabric.scheduler.placement import Group, capacity_ok, evaluate
from llmfabric.scheduler.policies import plan
from llmfabric.scheduler.problem import Cluster, FixedGroup, ModelLoad, Pool, Problem, Workload
from llmfabric.scheduler.standin import AnalyticStandIn

FAST = PlacementOptions(workers=2, time_limit_s=20)


def _problem(a100: int = 2, gh200: int = 2) -> Problem:
    cluster = Cluster((Pool("a100", "A100-80GB", a100, 4), Pool("gh200", "GH200", gh200, 4)))
    wl = Workload((ModelLoad("Llama-2-13b", 20, 600, 128),
                   ModelLoad("Llama-3.3-70B-Instruct", 8, 900, 300)))
    return Problem(cluster, wl)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 6, 8]), st.integers(1, 3), st.booleans(),
       st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 5)), min_size=1,
                max_size=3))
def test_capacity_rule_matches_packing(size: int, nodes: int, exclusive: bool,
                                       items: list[tuple[int, int]]) -> None:
    pool = Pool("p", "A100-80GB", nodes, size, exclusive_nodes=exclusive)
    groups = [Group(f"m{i}", "p", "A100-80GB", tp, n, 1.0) for i, (tp, n) in enumerate(items)]
    try:
        slots = pack(pool, groups)
        packed = True
    except InfeasibleError:
        packed = False
    assert capacity_ok(pool, items) == packed
    if packed:
        used = [(s.node, g) for s in slots for g in s.gpu_ids]
        assert len(used) == len(set(used))  # no GPU is given twice
        assert len(slots) == sum(n for _, n in items)


def test_every_policy_respects_capacity_and_accounts_for_all_load(
        perf: AnalyticStandIn) -> None:
    """Packing and load accounting for every policy. (Whether CP-SAT beats the baselines is
    tested on the solver stage alone, in test_cpsat_stage.py: the policy returns the best of
    CP-SAT and its greedy warm start, so a policy-level comparison would prove little.)"""
    pr = _problem()
    for name in ("cpsat", "memp", "greedy"):
        p = plan(pr, perf, FAST, name)
        for pool in pr.cluster.pools:
            used = [(g.tp, g.replicas) for g in p.groups if g.pool == pool.name]
            assert capacity_ok(pool, used)
        for model in ("Llama-2-13b", "Llama-3.3-70B-Instruct"):
            shares = sum(g.load_share for g in p.groups if g.model == model)
            unserved = dict(p.unserved).get(model, 0.0)
            assert math.isclose(shares + unserved, 1.0, abs_tol=1e-9)
        ev = evaluate(pr, perf, p)
        assert math.isclose(ev.unserved_rps + sum(
            m.arrival_rate * g.load_share for m in pr.workload.loads for g in p.groups
            if g.model == m.model), pr.workload.total_rate, rel_tol=1e-9)


def test_memory_constraint_keeps_70b_off_single_gpus(perf: AnalyticStandIn) -> None:
    p = plan(_problem(), perf, FAST, "cpsat")
    for g in p.groups:
        assert perf.fits(g.model, g.gpu_type, g.tp, 900, 300)
        if g.model == "Llama-3.3-70B-Instruct":
            assert g.tp >= 2


def test_every_loaded_model_gets_a_replica(perf: AnalyticStandIn) -> None:
    # A tiny, heavily loaded 13B would take every GPU if coverage were not enforced.
    cluster = Cluster((Pool("a100", "A100-80GB", 1, 4),))
    wl = Workload((ModelLoad("Llama-2-13b", 400, 600, 128), ModelLoad("Llama-2-7b", 0.5, 100, 50)))
    p = plan(Problem(cluster, wl), perf, FAST, "cpsat")
    assert {g.model for g in p.groups} == {"Llama-2-13b", "Llama-2-7b"}


def test_coverage_relaxed_when_impossible(perf: AnalyticStandIn) -> None:
    cluster = Cluster((Pool("a100", "A100-80GB", 1, 1),))
    wl = Workload((ModelLoad("Llama-2-13b", 5, 600, 128), ModelLoad("Llama-2-7b", 1, 100, 50)))
    p = plan(Problem(cluster, wl), perf, FAST, "cpsat")
    assert len({g.model for g in p.groups}) == 1
    assert any("coverage" in n for n in p.notes)
    assert len(p.unserved) == 1 and p.unserved[0][1] == 1.0


def test_model_that_fits_nowhere_is_unserved(perf: AnalyticStandIn) -> None:
    cluster = Cluster((Pool("rtx", "RTX3090", 1, 1),))
    wl = Workload((ModelLoad("Llama-3.3-70B-Instruct", 1, 600, 128),
                   ModelLoad("Qwen3-1.7B", 1, 100, 50)))
    p = plan(Problem(cluster, wl), perf, FAST, "cpsat")
    assert [g.model for g in p.groups] == ["Qwen3-1.7B"]
    assert dict(p.unserved) == {"Llama-3.3-70B-Instruct": 1.0}


def test_fixed_groups_take_load_without_capacity(perf: AnalyticStandIn) -> None:
    pr = _problem(a100=1, gh200=0)
    fixed = (FixedGroup("Llama-3.3-70B-Instruct", "GH200", 4, 2, ("s1", "s2")),)
    p = plan(Problem(pr.cluster, pr.workload, fixed), perf, FAST, "cpsat")
    fx = [g for g in p.groups if g.fixed]
    assert len(fx) == 1 and fx[0].replicas == 2 and fx[0].load_share > 0
    # the new capacity holds only A100s; the running GH200 replicas still get load
    assert all(g.gpu_type == "A100-80GB" for g in p.groups if not g.fixed)


def test_cost_objective_uses_fewer_gpus_for_light_load(perf: AnalyticStandIn) -> None:
    cluster = Cluster((Pool("a100", "A100-80GB", 2, 4),))
    wl = Workload((ModelLoad("Llama-2-7b", 0.5, 200, 50),))
    lat = plan(Problem(cluster, wl), perf, FAST, "cpsat")
    cost = plan(Problem(cluster, wl), perf,
                PlacementOptions(objective="cost", workers=2, time_limit_s=20), "cpsat")
    assert sum(g.gpus for g in cost.groups) < sum(g.gpus for g in lat.groups)
    assert sum(g.gpus for g in cost.groups) >= 1


def test_throughput_objective_serves_everything_it_can(perf: AnalyticStandIn) -> None:
    p = plan(_problem(), perf, PlacementOptions(objective="throughput", workers=2,
                                                time_limit_s=20), "cpsat")
    assert p.objective > 0
    assert {g.model for g in p.groups} == {"Llama-2-13b", "Llama-3.3-70B-Instruct"}


def test_options_are_validated() -> None:
    with pytest.raises(SpecError, match="objective"):
        PlacementOptions(objective="fast")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="load_units"):
        PlacementOptions(load_units=0)
    with pytest.raises(SpecError):
        plan(_problem(), AnalyticStandIn(), FAST, "nope")


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_split_load_is_the_best_split(seed: int) -> None:
    """The DP split equals brute force over every way to give Q units to the groups."""
    import itertools
    import random

    from llmfabric.scheduler.placement import split_load
    from llmfabric.scheduler.tables import build_tables

    rng = random.Random(seed)
    cluster = Cluster((Pool("a", "A100-80GB", 1, 4), Pool("g", "GH200", 1, 2),
                       Pool("l", "L40S", 1, 2)))
    wl = Workload((ModelLoad("Llama-2-7b", rng.uniform(1, 60), 300, 100),))
    opts = PlacementOptions(load_units=6, curve_samples=None)
    t = build_tables(Problem(cluster, wl), AnalyticStandIn(), opts)
    chosen = {c.index: rng.randint(0, c.r_max) for c in t.candidates if c.tp == 1}
    value, units, unserved = split_load(t, chosen, "Llama-2-7b")
    live = [i for i, r in chosen.items() if r > 0]
    brute = min(
        sum(t.lat[i][t.idx(chosen[i], q)] for i, q in zip(live, qs, strict=True))
        + (t.q - sum(qs)) * t.unserved_unit["Llama-2-7b"]
        for qs in itertools.product(range(t.q + 1), repeat=len(live)) if sum(qs) <= t.q)
    assert value == brute
    assert sum(units.get(i, 0) for i in live) + unserved == t.q
