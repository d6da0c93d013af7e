"""Placement policies by name, one uniform signature: (problem, perf, options) -> Placement."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Protocol

from llmfabric.scheduler.baselines import Choice, greedy, improve, memp, score
from llmfabric.scheduler.cpsat import solve_cpsat
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.exhaustive import exhaustive
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.placement import Placement, groups_from
from llmfabric.scheduler.problem import Problem
from llmfabric.scheduler.split import model_split
from llmfabric.scheduler.tables import Tables, build_tables, formulation


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
    shares: dict[int, float] = {}
    total = 0.0
    unserved: dict[str, float] = {}
    for model in tables.loads:
        value, split, left = model_split(tables, chosen, model)
        shares.update(split)
        total += value
        if left > 1e-12:
            unserved[model] = left
    groups, overflow = groups_from(tables, chosen, shares)
    for model, extra in overflow.items():
        unserved[model] = unserved.get(model, 0.0) + extra
    return Placement(policy, groups, total, status, solve_s=solve_s, build_s=build_s,
                     unserved=tuple(sorted(unserved.items())))


def cpsat_policy(problem: Problem, perf: PerformanceModel, options: PlacementOptions,
                 tables: Tables | None = None) -> Placement:
    """CP-SAT, then (latency objective) the best of three candidates under the exact
    equal-split objective every policy is scored by: CP-SAT's replica counts as solved, the
    same polished by local search, and the greedy + local-search warm start.

    The returned placement says which one it is (`source`), CP-SAT's own status for its model
    (`solver_status`), and a gap computed from the FINAL objective and CP-SAT's bound, both
    in seconds of mean latency (`gap_of`). `status` describes the returned placement."""
    t, build_s = _tables(problem, perf, options, tables)
    t0 = time.perf_counter()
    # Greedy + local search is cheap; it hints the table/level formulations (the convex
    # formulation's LP is tight enough without) and is a fallback candidate either way.
    start = improve(t, greedy(t)) if options.objective == "latency" else None
    hint = None if formulation(t) == "convex" else start
    t1 = time.perf_counter()
    placed = solve_cpsat(problem, t, options, hint=hint)
    t2 = time.perf_counter()
    if options.objective != "latency" or start is None:
        return replace(placed, solve_s=t2 - t0, build_s=build_s, source="cpsat",
                       solver_status=placed.status,
                       stages=(("warm_start", t1 - t0), ("cpsat", t2 - t1)))
    solved = _replicas_of(t, placed)
    polished = improve(t, solved)
    pool = [("cpsat", solved), ("cpsat+polish", polished), ("warm start", start)]
    source, chosen = min(pool, key=lambda kv: score(t, kv[1]))  # ties: the earliest stage
    notes = placed.notes
    if source == "cpsat+polish":
        notes += ("CP-SAT's replica counts improved by local search under the exact "
                  "equal-split objective",)
    elif source == "warm start":
        notes += ("the greedy + local-search warm start scored better than CP-SAT's solution "
                  "under the exact equal-split objective; it is returned",)
    final = placement_from_choice(t, chosen, "cpsat", placed.status, 0.0, build_s)
    gap = gap_of(final.objective, placed.bound)
    if gap < -_BOUND_SLACK:
        notes += (f"CP-SAT's bound ({placed.bound:.4g} s, {formulation(t)} formulation) lies "
                  f"above the exact objective: the formulation approximates the tables",)
    t3 = time.perf_counter()
    return replace(final, status=_status(placed.status, gap, options.gap_limit),
                   bound=placed.bound, gap=max(gap, 0.0), solve_s=t3 - t0, notes=notes,
                   source=source, solver_status=placed.status,
                   stages=(("warm_start", t1 - t0), ("cpsat", t2 - t1), ("polish", t3 - t2)))


_BOUND_SLACK = 1e-3  # relative: the convex cuts' integer rounding can put the bound this far up


def gap_of(objective: float, bound: float) -> float:
    """Relative gap of a final objective to a lower bound, both in seconds of mean latency."""
    if math.isnan(bound) or objective <= 0:
        return math.nan
    return (objective - bound) / objective


def _status(solver: str, gap: float, gap_limit: float) -> str:
    """The returned placement's status: proven optimal or within the gap limit only when
    the FINAL objective is (against CP-SAT's bound); otherwise merely feasible."""
    if solver in ("OPTIMAL", "OPTIMAL_WITHIN_GAP") and not math.isnan(gap):
        if -_BOUND_SLACK <= gap <= 1e-6:
            return "OPTIMAL"
        if 0 < gap <= gap_limit + 1e-9:
            return "OPTIMAL_WITHIN_GAP"
    return "FEASIBLE"  # a worse gap, or a bound above the objective (not a bound for it)


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
