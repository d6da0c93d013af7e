"""Placement policies by name, one uniform signature: (problem, perf, options) -> Placement."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from llmfabric.scheduler.baselines import Choice, greedy, improve, memp, score
from llmfabric.scheduler.cpsat import formulation, solve_cpsat
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.exhaustive import exhaustive
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.placement import Placement, groups_from, split_load
from llmfabric.scheduler.problem import Problem
from llmfabric.scheduler.tables import LAT_SCALE, Tables, build_tables


class PlacementPolicy(Protocol):
    def __call__(self, problem: Problem, perf: PerformanceModel,
                 options: PlacementOptions, tables: Tables | None = None) -> Placement: ...


def _tables(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
            tables: Tables | None) -> tuple[Tables, float]:
    if tables is not None:
        return tables, 0.0
    t0 = time.perf_counter()
    built = build_tables(problem, perf, options)
    return built, time.perf_counter() - t0


def placement_from_choice(tables: Tables, chosen: Choice, policy: str, status: str,
                          solve_s: float, build_s: float) -> Placement:
    """Turn replica counts into a Placement, splitting each model's load optimally."""
    units: dict[int, int] = {}
    total = 0
    unserved: list[tuple[str, float]] = []
    for model in tables.loads:
        value, split, left = split_load(tables, chosen, model)
        units.update(split)
        total += value
        if left:
            unserved.append((model, left / tables.q))
    return Placement(policy, groups_from(tables, chosen, units), total / LAT_SCALE, status,
                     solve_s=solve_s, build_s=build_s, unserved=tuple(unserved))


def cpsat_policy(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
                 tables: Tables | None = None) -> Placement:
    """CP-SAT (warm-started by greedy + local search except in the convex formulation), then
    a local polish of its replica counts under the exact equal-split objective (the rate grid
    and envelope are approximations). Status, bound and gap are CP-SAT's, for its model."""
    t, build_s = _tables(problem, perf, options, tables)
    t0 = time.perf_counter()
    # The convex formulation's LP is tight enough that CP-SAT needs no warm start; the others
    # start from greedy + local search.
    start = None if formulation(t) == "convex" else improve(t, greedy(t))
    t1 = time.perf_counter()
    placed = solve_cpsat(problem, t, options, hint=start)
    t2 = time.perf_counter()
    if options.objective != "latency":
        return replace(placed, solve_s=t2 - t0, build_s=build_s,
                       stages=(("warm_start", t1 - t0), ("cpsat", t2 - t1)))
    chosen = _replicas_of(t, placed)
    polished = improve(t, chosen)
    notes = placed.notes
    if polished != chosen:
        notes += ("replica counts polished by local search after CP-SAT",)
    if start is not None and score(t, start) < score(t, polished):
        polished = start
        notes += ("the warm start scored better under the exact equal-split objective",)
    final = placement_from_choice(t, polished, "cpsat", placed.status, 0.0, build_s)
    t3 = time.perf_counter()
    return replace(final, bound=placed.bound, gap=placed.gap, solve_s=t3 - t0, notes=notes,
                   stages=(("warm_start", t1 - t0), ("cpsat", t2 - t1), ("polish", t3 - t2)))


def _replicas_of(t: Tables, p: Placement) -> Choice:
    index = {(c.model, c.pool, c.tp): c.index for c in t.candidates if not c.fixed}
    chosen: Choice = {c.index: c.r_min for c in t.candidates if c.fixed}
    for g in p.groups:
        if not g.fixed:
            chosen[index[(g.model, g.pool, g.tp)]] = g.replicas
    return chosen


def memp_policy(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
                tables: Tables | None = None) -> Placement:
    t, build_s = _tables(problem, perf, options, tables)
    t0 = time.perf_counter()
    chosen = memp(t, perf)
    return placement_from_choice(t, chosen, "memp", "HEURISTIC", time.perf_counter() - t0,
                                 build_s)


def greedy_policy(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
                  tables: Tables | None = None) -> Placement:
    t, build_s = _tables(problem, perf, options, tables)
    t0 = time.perf_counter()
    chosen = greedy(t)
    return placement_from_choice(t, chosen, "greedy", "HEURISTIC", time.perf_counter() - t0,
                                 build_s)


def exhaustive_policy(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
                      tables: Tables | None = None) -> Placement:
    if options.objective != "latency":
        raise SpecError("the exhaustive policy supports objective='latency' only")
    t, build_s = _tables(problem, perf, options, tables)
    t0 = time.perf_counter()
    _, chosen = exhaustive(t)
    return placement_from_choice(t, chosen, "exhaustive", "OPTIMAL", time.perf_counter() - t0,
                                 build_s)


POLICIES: dict[str, PlacementPolicy] = {
    "cpsat": cpsat_policy,
    "memp": memp_policy,
    "greedy": greedy_policy,
    "exhaustive": exhaustive_policy,
}


def get_policy(name: str) -> PlacementPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise SpecError(f"unknown placement policy {name!r}; choose one of {sorted(POLICIES)}"
                        ) from None


def plan(problem: Problem, perf: PerformanceModel, options: PlacementOptions | None = None,
         policy: str = "cpsat") -> Placement:
    """Place `problem` with the named policy."""
    return get_policy(policy)(problem, perf, options or PlacementOptions())
