"""Candidates and their precomputed tables: what the solver, the enumerator and the baselines share.

A candidate is (model, pool, TP). For every replica count r and load share q/Q of the model's
arrival rate it gets integer table entries, computed from the performance model at the
per-replica rate lambda*q/(Q*r):
  lat[r][q]  = mean-latency contribution, in units of 0.1 ms of the workload's mean E2E latency
               (r * h(x) / Lambda with h the replica's latency cost at per-replica rate x,
               `curves.RateCurve.cost`: served requests at their latency, load above the
               replica's capacity at the unserved penalty);
  good[r][q] = goodput in 0.01 req/s (served requests/s; 0 where the model's SLO is missed).
The level and convex formulations get the same costs at log-spaced per-replica load levels,
plus the capacity point, and their lower convex envelope (cuts and vertices).
Rates are sampled on a log grid and interpolated (or queried exactly), then cached.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from llmfabric.scheduler.curves import RateCurve
from llmfabric.scheduler.errors import InfeasibleError, SpecError
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.problem import ModelLoad, Pool, Problem

LAT_SCALE = 1e4  # table units per second of mean latency
LVL_SCALE = 1e7  # level/convex-formulation units per second of mean latency (finer)
GOOD_SCALE = 100.0  # table units per req/s


def level_grid(count: int, units: int) -> list[int]:
    """About `count` log-spaced per-replica load levels in 1..units (integers, ascending)."""
    out = sorted({max(1, round(units ** (k / (count - 1)))) for k in range(count)})
    return [v for v in out if v <= units]


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int
    model: str
    pool: str  # pool name, or "" for a fixed (already running) group
    gpu_type: str
    tp: int
    r_min: int
    r_max: int
    price_cents_per_hour: int  # per replica

    @property
    def fixed(self) -> bool:
        return self.pool == ""


@dataclass(slots=True)
class Tables:
    problem: Problem
    options: PlacementOptions
    candidates: list[Candidate]
    lat: list[list[int]]  # per candidate, flattened [r * (Q + 1) + q]
    good: list[list[int]]
    unserved_unit: dict[str, int]  # model -> latency units charged per unserved load unit
    loads: dict[str, ModelLoad]
    curves: dict[tuple[str, str, int], RateCurve] = field(default_factory=dict)
    # Level formulation: per-replica load levels (units of arrival_rate / options.level_units)
    # and, per candidate, one replica's latency units and goodput units at each level.
    levels: list[int] = field(default_factory=list)
    lvl_lat: list[list[int]] = field(default_factory=list)
    lvl_good: list[list[int]] = field(default_factory=list)
    # Convex formulation: per candidate, the lower convex envelope of one replica's latency
    # cost h(w) (w in level units of load) as cuts cost >= a*w + b*r, and the most goodput
    # one replica gives within the SLO (GOOD_SCALE units).
    hull: list[list[tuple[int, int]]] = field(default_factory=list)
    hull_pts: list[list[tuple[float, float]]] = field(default_factory=list)  # its vertices
    good_cap: list[int] = field(default_factory=list)

    @property
    def q(self) -> int:
        return self.options.load_units

    def idx(self, r: int, q: int) -> int:
        return r * (self.q + 1) + q

    @property
    def u(self) -> int:
        return self.options.level_units

    def level_pen(self, model: str) -> int:
        """Latency units charged per unserved level unit of `model`."""
        load, total = self.loads[model], sum(m.arrival_rate for m in self.loads.values())
        return round(LVL_SCALE * load.arrival_rate / self.u / total
                     * self.options.unserved_latency_s)

    def by_model(self) -> dict[str, list[Candidate]]:
        out: dict[str, list[Candidate]] = {m: [] for m in self.loads}
        for c in self.candidates:
            out[c.model].append(c)
        return out

    def by_pool(self) -> dict[str, list[Candidate]]:
        out: dict[str, list[Candidate]] = {p.name: [] for p in self.problem.cluster.pools}
        for c in self.candidates:
            if not c.fixed:
                out[c.pool].append(c)
        return out


def _price(perf: PerformanceModel, pool: Pool) -> float:
    if pool.cost_per_gpu_hour > 0:
        return pool.cost_per_gpu_hour
    return perf.gpu(pool.gpu_type).cost_per_hour


def build_tables(problem: Problem, perf: PerformanceModel, options: PlacementOptions) -> Tables:
    """Enumerate memory-feasible candidates and fill their tables."""
    loads = {m.model: m for m in problem.workload.loads if m.arrival_rate > 0}
    if not loads:
        raise InfeasibleError("the workload has no model with arrival_rate > 0; nothing to place")
    total = sum(m.arrival_rate for m in loads.values())
    qn = options.load_units
    cands: list[Candidate] = []
    for load in loads.values():
        for pool in problem.cluster.pools:
            if pool.nodes == 0:
                continue
            price = _price(perf, pool)
            for tp in pool.tp_options():
                if not _fits(perf, load, pool, tp):
                    continue
                per_node = pool.gpus_per_node // tp
                rmax = pool.nodes * per_node
                cands.append(Candidate(len(cands), load.model, pool.name, pool.gpu_type, tp, 0,
                                       rmax, round(100 * price * tp)))
        for fx in problem.fixed:
            if fx.model == load.model and fx.replicas > 0:
                cands.append(Candidate(len(cands), load.model, "", fx.gpu_type, fx.tp,
                                       fx.replicas, fx.replicas, 0))
    tables = Tables(problem, options, cands, [], [], {}, loads)
    tables.levels = level_grid(options.curve_samples or 24, options.level_units)
    cap_s = options.unserved_latency_s
    for model, load in loads.items():
        tables.unserved_unit[model] = round(LAT_SCALE * load.arrival_rate / qn / total * cap_s)
    for c in cands:
        load = loads[c.model]
        key = (c.model, c.gpu_type, c.tp)
        curve = tables.curves.get(key)
        if curve is None:
            rmax_all = max(x.r_max for x in cands if (x.model, x.gpu_type, x.tp) == key)
            grid: list[float] | None = None
            if options.curve_samples is not None:
                lam = load.arrival_rate
                grid = [lam * lv / tables.options.level_units for lv in tables.levels]
                lo = lam / (qn * max(1, rmax_all))
                if lo < grid[0]:
                    grid.insert(0, lo)
            curve = RateCurve(perf, load, c.gpu_type, c.tp, grid, options.max_utilization)
            tables.curves[key] = curve
        lat = [0] * ((c.r_max + 1) * (qn + 1))
        good = [0] * len(lat)
        slo = load.slo_e2e_s
        for r in range(1, c.r_max + 1):
            for q in range(1, qn + 1):
                x = load.arrival_rate * q / qn / r  # per-replica rate
                h, served = curve.cost(x, cap_s)
                lat[tables.idx(r, q)] = round(LAT_SCALE * r * h / total)
                good[tables.idx(r, q)] = round(GOOD_SCALE * r * served) if _meets(
                    curve, x, slo) else 0
        tables.lat.append(lat)
        tables.good.append(good)
        lvl_lat, lvl_good = [], []
        pts = [(0.0, 0.0)]
        for lv in tables.levels:
            rate = load.arrival_rate * lv / tables.options.level_units
            h, served = curve.cost(rate, cap_s)
            lvl_lat.append(round(LVL_SCALE * h / total))
            lvl_good.append(round(GOOD_SCALE * served) if _meets(curve, rate, slo) else 0)
            pts.append((float(lv), LVL_SCALE * h / total))
        mu = curve.capacity
        good_cap = max(lvl_good, default=0)
        if 0 < mu < load.arrival_rate:  # the capacity kink is a vertex of the envelope
            mu_lv = mu * tables.options.level_units / load.arrival_rate
            pts.append((mu_lv, LVL_SCALE * curve.cost(mu, cap_s)[0] / total))
            if _meets(curve, mu, slo):
                good_cap = max(good_cap, round(GOOD_SCALE * mu))
        tables.lvl_lat.append(lvl_lat)
        tables.lvl_good.append(lvl_good)
        tables.hull_pts.append(lower_hull(pts))
        tables.hull.append(hull_cuts(pts))
        tables.good_cap.append(good_cap)
    return tables


def formulation(tables: Tables) -> str:
    """The formulation `tables.options.formulation` resolves to for these tables."""
    chosen = tables.options.formulation
    if chosen != "auto":
        return chosen
    tuples = sum((c.r_max - c.r_min + 1) * (tables.q + 1) for c in tables.candidates)
    return "table" if tuples <= tables.options.table_max_tuples else "convex"


def lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Vertices of the lower convex envelope of `points` (x ascending)."""
    hull: list[tuple[float, float]] = []
    for p in sorted(points):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()  # hull[-1] lies on or above the segment hull[-2] -> p
            else:
                break
        if hull and p[0] <= hull[-1][0]:
            continue  # same x: the lower point came first
        hull.append(p)
    return hull


def hull_cuts(points: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """Cuts (a, b) with y >= a*x + b along the lower convex envelope of `points` (x ascending
    from (0, 0)), rounded to integers for CP-SAT (off the envelope by at most rounding)."""
    cuts = []
    for (x1, y1), (x2, y2) in itertools.pairwise(lower_hull(points)):
        a = (y2 - y1) / (x2 - x1)
        cuts.append((round(a), round(y1 - a * x1)))
    return cuts or [(0, 0)]


def _meets(curve: RateCurve, rate: float, slo_s: float) -> bool:
    """Whether the requests a replica serves at `rate` meet the model's E2E SLO (if any)."""
    return slo_s <= 0 or curve.served(rate)[0] <= slo_s


def _fits(perf: PerformanceModel, load: ModelLoad, pool: Pool, tp: int) -> bool:
    try:
        return perf.fits(load.model, pool.gpu_type, tp, load.mean_in, load.mean_out)
    except KeyError as e:
        raise SpecError(f"the performance model does not know {e}; check the names in the "
                        "cluster and workload files") from None
