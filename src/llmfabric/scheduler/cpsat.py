"""CP-SAT placement: allocation and parallelism chosen jointly from precomputed estimates.

Per candidate g = (model, pool, TP): replicas r_g (the DP degree of that group) and y_g (the
group exists). The estimates enter in one of three formulations (`formulation()`):

- convex (default above small sizes): w_g = load units the group takes; with h(x) the cost
  of one replica at load x (its latency times its rate) replaced by the lower convex envelope
  max_j (a_j x + b_j), r replicas sharing w cost r*h(w/r) = max_j (a_j w + b_j r), i.e. a few
  linear cuts per candidate (the perspective of h). Tight LP: 128 GPUs solve in ~2 s.
- table (default for small instances): a table constraint (r_g, q_g, lat_g[, good_g]) over
  every replica count and load share q/Q split equally among the r replicas. Exact for equal
  splits; its expansion makes presolve slow past ~50 GPUs.
- levels: integer n_{g,k} = replicas of g at per-replica load level k; linear, but its LP
  bound closes slowly. Kept for comparison.

Constraints: C1/C3 per pool, replicas x TP pack into the nodes (`placement.capacity_ok`);
C2 candidates exist only where weights + KV fit (`tables.build_tables`); one TP degree per
(model, pool); every model with load gets a replica when feasible (lexicographically first).
Objectives: latency (min mean E2E, the paper's eq. 1); throughput (max goodput under SLOs,
then min latency); cost (max goodput, then min $/h, i.e. cost per token at the served load).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from ortools.sat.python import cp_model

from llmfabric.scheduler.errors import SolverError
from llmfabric.scheduler.levels import split_envelope, split_levels
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.placement import Placement, groups_from
from llmfabric.scheduler.problem import Problem
from llmfabric.scheduler.tables import GOOD_SCALE, LAT_SCALE, LVL_SCALE, Tables, formulation

_STATUS = {
    cp_model.OPTIMAL: "OPTIMAL",
    cp_model.FEASIBLE: "FEASIBLE",
    cp_model.INFEASIBLE: "INFEASIBLE",
    cp_model.MODEL_INVALID: "MODEL_INVALID",
    cp_model.UNKNOWN: "UNKNOWN",
}

_RANK = ["FEASIBLE", "OPTIMAL_WITHIN_GAP", "OPTIMAL"]  # weakest first

Expr = Any  # cp_model linear expressions (their stubs do not mix with int sums)


class _Model:
    def __init__(self, tables: Tables, options: PlacementOptions) -> None:
        self.t = tables
        self.m = cp_model.CpModel()
        t, m = tables, self.m
        self.form = formulation(tables)
        self.levels = self.form in ("levels", "convex")  # both count load in level units
        with_good = options.objective != "latency"
        self.r: list[cp_model.IntVar] = []
        self.y: list[cp_model.IntVar] = []
        self.load: list[Expr] = []  # units of the model's load taken by the candidate
        lat_terms: list[Expr] = []
        good_by_model: dict[str, list[Expr]] = {k: [] for k in t.loads}
        self.n: list[list[cp_model.IntVar]] = []
        self.w: list[cp_model.IntVar] = []
        self.cost: list[cp_model.IntVar] = []
        for c in t.candidates:
            r = m.new_int_var(c.r_min, c.r_max, f"r{c.index}")
            y = m.new_bool_var(f"y{c.index}")
            m.add(r >= 1).only_enforce_if(y)
            m.add(r == 0).only_enforce_if(y.negated())
            self.r.append(r)
            self.y.append(y)
            if self.form == "convex":
                u_all = t.u
                w = m.new_int_var(0, u_all, f"w{c.index}")
                m.add(w <= u_all * y)
                cuts = t.hull[c.index]
                hi = max(0, max(a * u_all + b * rr for a, b in cuts
                                for rr in (max(1, c.r_min), c.r_max)))
                cost = m.new_int_var(0, hi, f"c{c.index}")
                for a, b in cuts:
                    m.add(cost >= a * w + b * r)
                self.w.append(w)
                self.cost.append(cost)
                self.load.append(w)
                lat_terms.append(cost)
                if with_good:
                    good = m.new_int_var(0, t.good_cap[c.index] * c.r_max, f"good{c.index}")
                    m.add(good <= t.good_cap[c.index] * r)
                    rate_units = GOOD_SCALE * t.loads[c.model].arrival_rate / u_all
                    m.add(good * u_all <= round(rate_units * u_all) * w)
                    good_by_model[c.model].append(good)
            elif self.form == "levels":
                ns = [m.new_int_var(0, c.r_max, f"n{c.index}_{k}") for k in range(len(t.levels))]
                m.add(sum(ns) <= r)
                self.n.append(ns)
                self.load.append(sum(lv * n for lv, n in zip(t.levels, ns, strict=True)))
                lat_terms.append(sum(w * n for w, n in zip(t.lvl_lat[c.index], ns, strict=True)))
                good_by_model[c.model].append(
                    sum(w * n for w, n in zip(t.lvl_good[c.index], ns, strict=True)))
            else:
                qn = t.q
                q = m.new_int_var(0, qn, f"q{c.index}")
                lat = m.new_int_var(0, max(t.lat[c.index]), f"lat{c.index}")
                m.add(q <= qn * y)
                cols: list[cp_model.IntVar] = [r, q, lat]
                if with_good:
                    good = m.new_int_var(0, max(t.good[c.index]), f"good{c.index}")
                    cols.append(good)
                    good_by_model[c.model].append(good)
                tuples = [
                    (rr, qq, t.lat[c.index][t.idx(rr, qq)], t.good[c.index][t.idx(rr, qq)])[
                        : len(cols)]
                    for rr in range(c.r_min, c.r_max + 1) for qq in range(qn + 1)
                    if rr > 0 or qq == 0]
                m.add_allowed_assignments(cols, tuples)
                self.load.append(q)
                lat_terms.append(lat)
        self._capacity()
        units = t.u if self.levels else t.q
        self.unserved: dict[str, cp_model.IntVar] = {}
        self.covered: list[cp_model.IntVar] = []
        good_terms: list[Expr] = []
        for model, cands in t.by_model().items():
            u = m.new_int_var(0, units, f"u_{model}")
            self.unserved[model] = u
            taken = sum(self.load[c.index] for c in cands) + u
            if self.levels:
                m.add(taken >= units)
            else:
                m.add(taken == units)
            pen = t.level_pen(model) if self.levels else t.unserved_unit[model]
            lat_terms.append(pen * u)
            if cands:
                cov = m.new_bool_var(f"cov_{model}")
                m.add_bool_or([self.y[c.index] for c in cands]).only_enforce_if(cov)
                self.covered.append(cov)
            if with_good:
                cap = round(GOOD_SCALE * t.loads[model].arrival_rate)
                gp = m.new_int_var(0, cap, f"gp_{model}")
                m.add(gp <= sum(good_by_model[model]))
                good_terms.append(gp)
        self.lat_expr: Expr = sum(lat_terms)
        self.good_expr: Expr = sum(good_terms)
        self.cost_expr: Expr = sum(r * c.price_cents_per_hour
                                   for r, c in zip(self.r, t.candidates, strict=True))

    def _capacity(self) -> None:
        t, m = self.t, self.m
        by_pool = t.by_pool()
        for pool in t.problem.cluster.pools:
            cands = by_pool[pool.name]
            if not cands:
                continue
            if pool.exclusive_nodes:
                ks = []
                for c in cands:
                    k = m.new_int_var(0, pool.nodes, f"k{c.index}")
                    m.add(self.r[c.index] <= k * (pool.gpus_per_node // c.tp))
                    ks.append(k)
                m.add(sum(ks) <= pool.nodes)
            else:
                for deg in pool.tp_options():
                    big = [c for c in cands if c.tp >= deg]
                    cap = pool.nodes * (pool.gpus_per_node // deg) * deg
                    m.add(sum(self.r[c.index] * c.tp for c in big) <= cap)
            if t.options.one_tp_per_pool:
                per: dict[str, list[int]] = {}
                for c in cands:
                    per.setdefault(c.model, []).append(c.index)
                for idxs in per.values():
                    if len(idxs) > 1:
                        m.add_at_most_one(self.y[i] for i in idxs)

    def hint_replicas(self, chosen: dict[int, int]) -> None:
        """Hint replica counts and, in the level formulation, a complete level assignment."""
        self.m.clear_hints()  # type: ignore[no-untyped-call]
        t = self.t
        for c in t.candidates:
            self.m.add_hint(self.r[c.index], chosen.get(c.index, c.r_min))
            self.m.add_hint(self.y[c.index], chosen.get(c.index, c.r_min) > 0)
        if self.form == "convex":
            for model in t.loads:
                units = split_envelope(t, chosen, model)[1]
                taken = 0
                for c in t.by_model()[model]:
                    w = int(units.get(c.index, 0.0)) if chosen.get(c.index, 0) else 0
                    taken += w
                    self.m.add_hint(self.w[c.index], w)
                    r = chosen.get(c.index, c.r_min)
                    self.m.add_hint(self.cost[c.index],
                                    max(0, max(a * w + b * r for a, b in t.hull[c.index])))
                self.m.add_hint(self.unserved[model], max(0, t.u - taken))
            return
        if not self.levels:
            return
        for model in t.loads:
            _, counts, unserved = split_levels(t, chosen, model)
            self.m.add_hint(self.unserved[model], unserved)
            for c in t.by_model()[model]:
                row = counts.get(c.index, [0] * len(t.levels))
                for var, n in zip(self.n[c.index], row, strict=True):
                    self.m.add_hint(var, n)


@dataclass(frozen=True, slots=True)
class _Solved:
    replicas: dict[int, int]
    units: dict[int, int]  # load units per candidate (level units or q units)
    status: str
    objective: float
    bound: float
    gap: float
    secondary: str = ""  # "name=value" of a lexicographic second phase


def solve_cpsat(problem: Problem, tables: Tables, options: PlacementOptions,
                hint: dict[int, int] | None = None) -> Placement:
    """Solve on prebuilt tables; `hint` is {candidate index: replicas} (e.g. from greedy)."""
    t0 = time.perf_counter()
    mdl = _Model(tables, options)
    notes: list[str] = []
    if mdl.covered:
        mdl.m.add(sum(mdl.covered) == len(mdl.covered))
    if hint:
        mdl.hint_replicas(hint)
    try:
        solved = _phases(mdl, options, t0)
    except _Infeasible:
        notes.append("not every model with load can get a replica; coverage maximized first")
        mdl = _Model(tables, options)
        if hint:
            mdl.hint_replicas(hint)
        big = _big(tables)
        mdl.lat_expr = mdl.lat_expr - big * sum(mdl.covered)
        mdl.good_expr = mdl.good_expr + big * sum(mdl.covered)
        solved = _phases(mdl, options, t0)
    return _placement(tables, solved, time.perf_counter() - t0, notes)


class _Infeasible(Exception):
    pass


def _phases(mdl: _Model, options: PlacementOptions, t0: float) -> _Solved:
    if options.objective == "latency":
        phases: list[tuple[str, Expr, bool]] = [("latency", mdl.lat_expr, False)]
    elif options.objective == "throughput":
        phases = [("goodput", mdl.good_expr, True), ("latency", mdl.lat_expr, False)]
    else:
        phases = [("goodput", mdl.good_expr, True), ("cost", mdl.cost_expr, False)]
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = options.workers
    solver.parameters.random_seed = options.seed
    solver.parameters.relative_gap_limit = options.gap_limit
    m, t = mdl.m, mdl.t
    solved: _Solved | None = None
    for i, (name, expr, maximize) in enumerate(phases):
        remaining = options.time_limit_s - (time.perf_counter() - t0)
        solver.parameters.max_time_in_seconds = max(0.05, remaining / (len(phases) - i))
        if maximize:
            m.maximize(expr)
        else:
            m.minimize(expr)
        status = solver.solve(m)
        if status == cp_model.INFEASIBLE and i == 0:
            raise _Infeasible
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise SolverError(f"CP-SAT returned {_STATUS.get(status, status)} in phase {name!r}; "
                              "raise the time limit or check that the cluster can hold the models")
        obj, bnd = solver.objective_value, solver.best_objective_bound
        replicas = {c.index: int(solver.value(mdl.r[c.index])) for c in t.candidates}
        units = {c.index: int(solver.value(mdl.load[c.index])) for c in t.candidates}
        lat_scale = LVL_SCALE if mdl.levels else LAT_SCALE
        scale = {"latency": lat_scale, "goodput": GOOD_SCALE, "cost": 100.0}[name]
        gap = abs(obj - bnd) / max(abs(obj), 1e-9)
        name_ = _STATUS[status]
        if status == cp_model.OPTIMAL and gap > 1e-9:
            name_ = "OPTIMAL_WITHIN_GAP"  # stopped at options.gap_limit
        if solved is None:  # the first (primary) phase's value, bound and gap are reported
            solved = _Solved(replicas, units, name_, obj / scale, bnd / scale, gap)
        else:
            solved = replace(solved, replicas=replicas, units=units,
                             status=min(solved.status, name_, key=_RANK.index),
                             secondary=f"then {name}: {obj / scale:.6g}")
        if i + 1 < len(phases):  # keep this phase's optimum while optimizing the next
            m.add(expr >= round(obj)) if maximize else m.add(expr <= round(obj))
            m.clear_hints()  # type: ignore[no-untyped-call]
            for c in t.candidates:
                m.add_hint(mdl.r[c.index], replicas[c.index])
    if solved is None:
        raise SolverError("no objective phase ran")
    return solved


def _big(tables: Tables) -> int:
    lat = sum(max(row) for row in tables.lat) + sum(
        max(row) * c.r_max for row, c in zip(tables.lvl_lat, tables.candidates, strict=True))
    lat += sum(max(0, max(a * tables.u + b * rr for a, b in cuts
                          for rr in (max(1, c.r_min), c.r_max)))
               for cuts, c in zip(tables.hull, tables.candidates, strict=True))
    pen = sum(max(tables.unserved_unit[m] * tables.q, tables.level_pen(m) * tables.u)
              for m in tables.loads)
    return lat + pen + round(GOOD_SCALE * sum(ld.arrival_rate for ld in tables.loads.values())) + 1


def _placement(tables: Tables, s: _Solved, solve_s: float, notes: list[str]) -> Placement:
    full = tables.u if formulation(tables) in ("levels", "convex") else tables.q
    shares: dict[int, float] = {}
    unserved: dict[str, float] = {}
    for model, cands in tables.by_model().items():
        taken = sum(s.units[c.index] for c in cands if s.replicas[c.index] > 0)
        denom = max(full, taken)
        for c in cands:
            if s.replicas[c.index] > 0:
                shares[c.index] = s.units[c.index] / denom
        if taken < full:
            unserved[model] = (full - taken) / full
    groups, overflow = groups_from(tables, s.replicas, shares)
    for model, extra in overflow.items():
        unserved[model] = unserved.get(model, 0.0) + extra
    if s.secondary:
        notes = [*notes, f"objective is the first phase; {s.secondary}"]
    return Placement("cpsat", groups, s.objective, s.status, s.bound, s.gap, solve_s,
                     unserved=tuple(sorted(unserved.items())), notes=tuple(notes))
