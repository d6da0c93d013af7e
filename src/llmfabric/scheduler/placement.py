"""A placement (the decision) and the pieces every policy shares to build and judge one.

- `Group`: replicas of one model on one pool with one TP degree, and the share of the model's
  load routed to them.
- `capacity_ok`: the node-packing rule (TP inside a node; exclusive pools hold one model per node).
- `split_load`: for fixed replica counts, the best split of each model's load over its groups
  (a small knapsack DP on the precomputed tables), so baselines and the solver are judged alike.
- `evaluate`: query the performance model at each group's exact per-replica rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.problem import Pool, Problem
from llmfabric.scheduler.tables import Candidate, Tables


@dataclass(frozen=True, slots=True)
class Group:
    model: str
    pool: str  # "" for replicas that were already running
    gpu_type: str
    tp: int
    replicas: int
    load_share: float  # fraction of the model's arrival rate routed to this group

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    @property
    def fixed(self) -> bool:
        return self.pool == ""


@dataclass(frozen=True, slots=True)
class Placement:
    policy: str
    groups: tuple[Group, ...]
    objective: float  # in the objective's own unit (s of mean latency, req/s, $/h)
    status: str = "FEASIBLE"  # OPTIMAL, FEASIBLE, HEURISTIC
    bound: float = math.nan
    gap: float = math.nan  # relative gap to the bound (0 when proven optimal)
    solve_s: float = 0.0
    build_s: float = 0.0
    unserved: tuple[tuple[str, float], ...] = ()  # (model, fraction of its load not placed)
    notes: tuple[str, ...] = field(default=())
    stages: tuple[tuple[str, float], ...] = ()  # (stage, seconds): warm start, cpsat, polish
    # Which stage produced the returned groups ("cpsat", "cpsat+polish", "warm start"), and
    # the solver's own status for its model (the `status` above describes what is returned).
    source: str = ""
    solver_status: str = ""

    def allocation(self) -> dict[str, dict[str, int]]:
        """Allocation matrix A: model -> GPU type -> GPUs (new groups only)."""
        out: dict[str, dict[str, int]] = {}
        for g in self.groups:
            if g.fixed:
                continue
            row = out.setdefault(g.model, {})
            row[g.gpu_type] = row.get(g.gpu_type, 0) + g.gpus
        return out

    def parallelism(self) -> dict[str, dict[str, tuple[int, int]]]:
        """model -> GPU type -> (DP, TP)."""
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for g in self.groups:
            if not g.fixed:
                out.setdefault(g.model, {})[g.gpu_type] = (g.replicas, g.tp)
        return out


def capacity_ok(pool: Pool, used: Iterable[tuple[int, int]]) -> bool:
    """Whether replicas [(tp, count), ...] of one or more models fit the pool's nodes.

    Non-exclusive pools: TP degrees are powers of two, so items form a divisibility chain and
    they pack iff for every degree t the replicas with TP >= t fit in each node's largest
    multiple of t. Exclusive pools: each (model, TP) group takes whole nodes.
    """
    items = list(used)
    if any(tp > pool.gpus_per_node for tp, count in items if count):
        return False
    if pool.exclusive_nodes:
        nodes = sum(-(-count // (pool.gpus_per_node // tp)) for tp, count in items if count)
        return nodes <= pool.nodes
    for t in pool.tp_options():
        need = sum(tp * count for tp, count in items if tp >= t)
        if need > pool.nodes * (pool.gpus_per_node // t) * t:
            return False
    return True


def split_load(tables: Tables, chosen: Mapping[int, int], model: str,
               maximize_goodput: bool = False) -> tuple[int, dict[int, int], int]:
    """Best split of `model`'s Q load units over candidates {index: replicas}.

    Returns (value, {index: units}, unserved units). Minimizes latency units (unserved units
    charged their penalty) or, with `maximize_goodput`, maximizes goodput (value negated so
    smaller is better either way).
    """
    qn = tables.q
    items = [(i, r) for i, r in chosen.items() if r > 0 and tables.candidates[i].model == model]
    inf = math.inf
    # best[u] = best value using exactly u units over the items seen so far
    best: list[float] = [inf] * (qn + 1)
    pen = tables.unserved_unit[model]
    for u in range(qn + 1):  # unserved units
        best[u] = 0 if maximize_goodput else u * pen
    picks: list[list[int]] = []
    for i, r in items:
        row = tables.good[i] if maximize_goodput else tables.lat[i]
        sign = -1 if maximize_goodput else 1
        nxt = [inf] * (qn + 1)
        arg = [0] * (qn + 1)
        for u in range(qn + 1):
            for q in range(u + 1):
                prev = best[u - q]
                if prev == inf:
                    continue
                v = prev + sign * row[tables.idx(r, q)]
                if v < nxt[u]:
                    nxt[u], arg[u] = v, q
        best = nxt
        picks.append(arg)
    # all Q units must be accounted for (served or unserved)
    units: dict[int, int] = {}
    u = qn
    for (i, _), arg in zip(reversed(items), reversed(picks), strict=True):
        units[i] = arg[u]
        u -= arg[u]
    return int(best[qn]), units, u


def groups_from(tables: Tables, chosen: Mapping[int, int], shares: Mapping[int, float]
                ) -> tuple[tuple[Group, ...], dict[str, float]]:
    """Groups with the load shares they serve, and per model the share left unserved.

    A group's share is clipped at its capacity (replicas x one replica's sustainable rate):
    the excess is what the tables priced as unserved (`curves.RateCurve.cost`), so it is
    reported as unserved rather than routed into a queue that would only grow."""
    out: list[Group] = []
    overflow: dict[str, float] = {}
    for i, r in sorted(chosen.items()):
        if r <= 0:
            continue
        c: Candidate = tables.candidates[i]
        share = shares.get(i, 0.0)
        served = min(share, capacity_share(tables, c, r))
        if share - served > 1e-12:
            overflow[c.model] = overflow.get(c.model, 0.0) + share - served
        out.append(Group(c.model, c.pool, c.gpu_type, c.tp, r, served))
    return tuple(out), overflow


def capacity_share(tables: Tables, c: Candidate, replicas: int) -> float:
    """The share of `c.model`'s arrival rate that `replicas` replicas of `c` sustain."""
    curve = tables.curves.get((c.model, c.gpu_type, c.tp))
    mu = curve.capacity if curve is not None else math.inf
    rate = tables.loads[c.model].arrival_rate
    return math.inf if math.isinf(mu) else replicas * mu / rate


@dataclass(frozen=True, slots=True)
class Evaluation:
    mean_latency_s: float  # over the load placed on replicas
    throughput_rps: float  # served (completed) requests per second, all models
    offered_rps: float
    unserved_rps: float  # load no replica takes
    per_model: tuple[tuple[str, float, float], ...]  # (model, mean latency s, throughput rps)
    cost_per_hour: float = 0.0
    # The planner's objective at exact rates: mean E2E over ALL offered requests, every
    # request not served (unplaced, or beyond a replica's capacity) charged the penalty.
    objective_s: float = math.nan


def evaluate(problem: Problem, perf: PerformanceModel, placement: Placement,
             unserved_latency_s: float = 1000.0) -> Evaluation:
    """Judge a placement with the performance model at each group's exact per-replica rate."""
    wl = {m.model: m for m in problem.workload.loads}
    prices = {p.name: p.cost_per_gpu_hour or perf.gpu(p.gpu_type).cost_per_hour
              for p in problem.cluster.pools}
    lat_w = thr = placed = cost = served_lat = 0.0
    per: dict[str, list[float]] = {}
    for g in placement.groups:
        load = wl[g.model]
        cost += prices.get(g.pool, 0.0) * g.gpus
        rate = load.arrival_rate * g.load_share
        if rate <= 0:
            continue
        est = perf.estimate(g.model, g.gpu_type, g.tp, rate / g.replicas, load.mean_in,
                            load.mean_out)
        served = min(est.throughput_rps * g.replicas, rate)
        e2e = est.mean_e2e_s if math.isfinite(est.mean_e2e_s) else unserved_latency_s
        lat_w += rate * e2e
        served_lat += served * min(e2e, unserved_latency_s)
        thr += served
        placed += rate
        acc = per.setdefault(g.model, [0.0, 0.0, 0.0])
        acc[0] += rate * e2e
        acc[1] += served
        acc[2] += rate
    offered = problem.workload.total_rate
    per_model = tuple((m, a[0] / a[2] if a[2] else math.nan, a[1]) for m, a in sorted(per.items()))
    objective = ((served_lat + (offered - thr) * unserved_latency_s) / offered if offered
                 else math.nan)
    return Evaluation(lat_w / placed if placed else math.nan, thr, offered, offered - placed,
                      per_model, cost, objective)
