"""Overload: load above a replica's capacity is unserved, never priced by a window artefact."""

from __future__ import annotations

import math

import pytest

from llmfabric.scheduler.curves import RateCurve
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.placement import evaluate
from llmfabric.scheduler.policies import plan
from llmfabric.scheduler.problem import Cluster, ModelLoad, Pool, Problem, Workload
from llmfabric.scheduler.standin import AnalyticStandIn
from llmfabric.scheduler.tables import build_tables

OPTS = PlacementOptions(workers=2, time_limit_s=20, gap_limit=0.0)


def _overloaded() -> Problem:
    cluster = Cluster((Pool("a100", "A100-80GB", 1, 4), Pool("gh200", "GH200", 1, 4)))
    wl = Workload((ModelLoad("Llama-2-13b", 400, 600, 128),
                   ModelLoad("Llama-3.3-70B-Instruct", 60, 900, 300)))
    return Problem(cluster, wl)


def test_curve_capacity_and_cost_above_it() -> None:
    perf = AnalyticStandIn()
    load = ModelLoad("Llama-2-13b", 400, 600, 128)
    curve = RateCurve(perf, load, "A100-80GB", 1, [1.0, 10.0, 100.0, 400.0], 0.8)
    service = perf.estimate("Llama-2-13b", "A100-80GB", 1, 400.0, 600, 128).throughput_rps
    assert curve.service_rate == pytest.approx(service)
    assert curve.capacity == pytest.approx(0.8 * service)
    assert curve.xs[-1] == pytest.approx(curve.capacity)  # the kink is a sample point
    lat_mu, served = curve.served(curve.capacity * 3)
    assert served == pytest.approx(curve.capacity)
    assert lat_mu == pytest.approx(curve.served(curve.capacity)[0])
    h1, _ = curve.cost(curve.capacity * 2, 1000.0)
    h2, _ = curve.cost(curve.capacity * 3, 1000.0)
    assert (h2 - h1) / curve.capacity == pytest.approx(1000.0)  # excess costs the penalty


def test_overloaded_plan_stays_within_capacity_and_reports_the_rest_unserved() -> None:
    perf = AnalyticStandIn()
    pr = _overloaded()
    t = build_tables(pr, perf, OPTS)
    p = plan(pr, perf, OPTS)
    rates = {m.model: m.arrival_rate for m in pr.workload.loads}
    for g in p.groups:
        per_replica = rates[g.model] * g.load_share / g.replicas
        assert per_replica <= t.curves[(g.model, g.gpu_type, g.tp)].capacity * (1 + 1e-9)
        est = perf.estimate(g.model, g.gpu_type, g.tp, per_replica, 600, 128)
        assert not est.saturated
    for model in rates:
        shares = sum(g.load_share for g in p.groups if g.model == model)
        assert shares + dict(p.unserved).get(model, 0.0) == pytest.approx(1.0)
    assert sum(dict(p.unserved).values()) > 0.3  # this cluster cannot take the load
    ev = evaluate(pr, perf, p, OPTS.unserved_latency_s)
    assert ev.throughput_rps < ev.offered_rps
    # the planner's objective and the exact-rate evaluation agree (envelope vs exact curve)
    assert ev.objective_s == pytest.approx(p.objective, rel=0.02)


def test_objective_does_not_depend_on_the_estimators_window() -> None:
    """Saturated estimates grow with the estimator's horizon; the plan must not."""
    pr = _overloaded()
    short = plan(pr, AnalyticStandIn(horizon_s=60.0), OPTS)
    long = plan(pr, AnalyticStandIn(horizon_s=600.0), OPTS)
    assert short.groups == long.groups
    assert math.isclose(short.objective, long.objective, rel_tol=1e-9)
