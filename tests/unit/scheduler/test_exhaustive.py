"""CP-SAT must find the enumerator's optimum on small instances, in both formulations."""

from __future__ import annotations

import random

import pytest

from llmfabric.scheduler.cpsat import solve_cpsat
from llmfabric.scheduler.exhaustive import exhaustive
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.problem import Cluster, ModelLoad, Pool, Problem, Workload
from llmfabric.scheduler.standin import AnalyticStandIn
from llmfabric.scheduler.tables import LAT_SCALE, LVL_SCALE, build_tables

MODELS = [("Llama-2-7b", 300, 100), ("Llama-2-13b", 600, 128), ("CodeLlama-34b", 800, 200),
          ("Qwen3-1.7B", 200, 80)]


def _instance(seed: int) -> Problem:
    rng = random.Random(seed)
    gpus = rng.sample(["A100-80GB", "GH200", "L40S", "A100-40GB"], 2)
    pools = tuple(Pool(g, g, rng.randint(1, 2), rng.choice([1, 2, 4])) for g in gpus)
    loads = tuple(ModelLoad(m, round(rng.uniform(0.5, 30.0), 2), i, o)
                  for m, i, o in rng.sample(MODELS, 2))
    return Problem(Cluster(pools), Workload(loads))


@pytest.mark.parametrize("seed", range(5))
def test_table_formulation_matches_enumeration(seed: int) -> None:
    opts = PlacementOptions(formulation="table", load_units=8, workers=2, time_limit_s=30,
                            gap_limit=0.0, curve_samples=None)
    pr = _instance(seed)
    tables = build_tables(pr, AnalyticStandIn(), opts)
    best, _ = exhaustive(tables, scorer="table")
    solved = solve_cpsat(pr, tables, opts)
    assert solved.status == "OPTIMAL"
    assert round(solved.objective * LAT_SCALE) == best


@pytest.mark.parametrize("seed", range(5))
def test_level_formulation_matches_enumeration(seed: int) -> None:
    opts = PlacementOptions(formulation="levels", level_units=40, curve_samples=6, workers=2,
                            time_limit_s=30, gap_limit=0.0)
    pr = _instance(seed)
    tables = build_tables(pr, AnalyticStandIn(), opts)
    best, _ = exhaustive(tables, scorer="levels")
    solved = solve_cpsat(pr, tables, opts)
    assert solved.status == "OPTIMAL"
    assert round(solved.objective * LVL_SCALE) == best


@pytest.mark.parametrize("seed", range(5))
def test_convex_formulation_matches_enumeration(seed: int) -> None:
    opts = PlacementOptions(formulation="convex", level_units=40, curve_samples=8, workers=2,
                            time_limit_s=30, gap_limit=0.0)
    pr = _instance(seed)
    tables = build_tables(pr, AnalyticStandIn(), opts)
    best, _ = exhaustive(tables, scorer="convex")
    solved = solve_cpsat(pr, tables, opts)
    assert solved.status == "OPTIMAL"
    assert round(solved.objective * LVL_SCALE) == best


def test_hull_cuts_lie_below_the_points() -> None:
    from llmfabric.scheduler.tables import hull_cuts

    pts = [(0.0, 0.0), (1.0, 5.0), (2.0, 7.0), (4.0, 20.0), (8.0, 100.0)]
    cuts = hull_cuts(pts)
    for x, y in pts:
        assert max(a * x + b for a, b in cuts) <= y + 1.0  # rounding slack
    # convex envelope: (1, 5) is above the chord from (0, 0) to (2, 7), so it is not a vertex
    assert max(a * 1 + b for a, b in cuts) < 5.0
