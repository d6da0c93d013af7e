"""Baselines: memP (the paper's comparison, after HexGen) and a greedy marginal-gain fill.

Both choose replica counts only; the load split over the chosen groups is the same DP the
solver's result is judged by (`split.model_split`), so comparisons isolate the allocation.
"""

from __future__ import annotations

import math

from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.placement import capacity_ok
from llmfabric.scheduler.problem import Pool
from llmfabric.scheduler.split import model_value
from llmfabric.scheduler.tables import Candidate, Tables

Choice = dict[int, int]  # candidate index -> replicas
_EPS = 1e-9  # seconds of mean latency: smaller changes are noise


def _pool_used(tables: Tables, chosen: Choice, pool: str) -> list[tuple[int, int]]:
    return [(tables.candidates[i].tp, r) for i, r in chosen.items()
            if r and tables.candidates[i].pool == pool]


def _fixed(tables: Tables) -> Choice:
    return {c.index: c.r_min for c in tables.candidates if c.fixed}


def memp(tables: Tables, perf: PerformanceModel) -> Choice:
    """GPUs proportional to arrival rate x parameter count; biggest model takes the best GPUs.

    Each model's GPU budget (largest-remainder rounding of its share of all free GPUs) is
    filled from GPU pools in order of speed, at the smallest TP degree that fits memory, in
    whole replicas; models are served largest first (as in the paper's Table 1).
    """
    pools = sorted(tables.problem.cluster.pools,
                   key=lambda p: (-perf.gpu(p.gpu_type).rank, -p.gpus, p.name))
    total_gpus = sum(p.gpus for p in pools)
    demand = {m: ld.arrival_rate * perf.params_b(m) for m, ld in tables.loads.items()}
    dsum = sum(demand.values()) or 1.0
    raw = {m: total_gpus * d / dsum for m, d in demand.items()}
    budget = {m: math.floor(v) for m, v in raw.items()}
    rest = total_gpus - sum(budget.values())
    for m in sorted(raw, key=lambda k: raw[k] - budget[k], reverse=True)[:rest]:
        budget[m] += 1
    chosen = _fixed(tables)
    by_model = tables.by_model()
    free = {p.name: p.gpus for p in pools}
    for model in sorted(budget, key=lambda k: -perf.params_b(k)):
        left = budget[model]
        for pool in pools:
            cands = sorted((c for c in by_model[model] if c.pool == pool.name), key=lambda c: c.tp)
            if not cands or left <= 0:
                continue
            c = cands[0]  # smallest TP that fits memory
            n = min(left, free[pool.name]) // c.tp
            while n > 0 and not _fits_more(tables, chosen, pool, c, n):
                n -= 1
            if n > 0:
                chosen[c.index] = chosen.get(c.index, 0) + n
                free[pool.name] -= n * c.tp
                left -= n * c.tp
    return chosen


def _fits_more(tables: Tables, chosen: Choice, pool: Pool, c: Candidate, n: int) -> bool:
    used = [*_pool_used(tables, chosen, pool.name), (c.tp, n)]
    return capacity_ok(pool, used)


def uncovered(tables: Tables, chosen: Choice) -> int:
    """How many models that could get a replica have none in `chosen`."""
    coverable = {c.model for c in tables.candidates}
    have = {tables.candidates[i].model for i, r in chosen.items() if r > 0}
    return len(coverable - have)


def score(tables: Tables, chosen: Choice) -> tuple[int, float]:
    """(uncovered models, objective s): the coverage-first order every policy uses."""
    return uncovered(tables, chosen), objective_of(tables, chosen)


def objective_of(tables: Tables, chosen: Choice) -> float:
    """Mean latency (s) of `chosen` with the best load split (unserved load at its penalty),
    on the model of the formulation the tables resolve to (`split.model_split`)."""
    return sum(model_value(tables, chosen, m) for m in tables.loads)


def greedy(tables: Tables) -> Choice:
    """Add, one at a time, the replica that lowers the objective most per GPU, while any does.

    Respects capacity and one TP degree per (model, pool); starts by giving each model its
    best single replica (coverage), largest load first.
    """
    chosen = _fixed(tables)
    pools = {p.name: p for p in tables.problem.cluster.pools}
    base = {m: model_value(tables, chosen, m) for m in tables.loads}

    def allowed(c: Candidate) -> bool:
        if c.fixed or chosen.get(c.index, 0) >= c.r_max:
            return False
        if tables.options.one_tp_per_pool and any(
                r and i != c.index and tables.candidates[i].pool == c.pool
                and tables.candidates[i].model == c.model for i, r in chosen.items()):
            return False
        return _fits_more(tables, chosen, pools[c.pool], c, 1)

    def gain(c: Candidate) -> float:
        trial = dict(chosen)
        trial[c.index] = trial.get(c.index, 0) + 1
        return base[c.model] - model_value(tables, trial, c.model)

    by_model = tables.by_model()
    for model in sorted(tables.loads, key=lambda m: -tables.loads[m].arrival_rate):
        if any(chosen.get(c.index, 0) for c in by_model[model]):
            continue
        options = [c for c in by_model[model] if allowed(c)]
        if options:
            c = max(options, key=lambda c: (gain(c) / c.tp, -c.index))
            chosen[c.index] = chosen.get(c.index, 0) + 1
            base[model] = model_value(tables, chosen, model)
    while True:
        best: tuple[float, int] | None = None
        for c in tables.candidates:
            if allowed(c):
                g = gain(c)
                if g > _EPS and (best is None or g / c.tp > best[0]):
                    best = (g / c.tp, c.index)
        if best is None:
            return chosen
        c = tables.candidates[best[1]]
        chosen[c.index] = chosen.get(c.index, 0) + 1
        base[c.model] = model_value(tables, chosen, c.model)


def improve(tables: Tables, chosen: Choice, max_rounds: int = 200) -> Choice:
    """Local search from `chosen`: best (remove one replica, add one replica) move while any
    lowers the objective. Pair gains are estimated from single-move gains, then checked."""
    chosen = dict(chosen)
    pools = {p.name: p for p in tables.problem.cluster.pools}
    value = {m: model_value(tables, chosen, m) for m in tables.loads}

    def ok(trial: Choice, c: Candidate) -> bool:
        if trial.get(c.index, 0) > c.r_max:
            return False
        if tables.options.one_tp_per_pool and any(
                r and i != c.index and tables.candidates[i].pool == c.pool
                and tables.candidates[i].model == c.model for i, r in trial.items()):
            return False
        return capacity_ok(pools[c.pool], _pool_used(tables, trial, c.pool))

    def delta(trial: Choice, models: set[str]) -> float:
        return sum(model_value(tables, trial, m) - value[m] for m in models)

    for _ in range(max_rounds):
        removals: list[tuple[float, int]] = []  # (delta, candidate)
        for i, r in chosen.items():
            c = tables.candidates[i]
            if r > 0 and not c.fixed:
                trial = dict(chosen)
                trial[i] = r - 1
                removals.append((delta(trial, {c.model}), i))
        adds: list[tuple[float, int]] = []
        for c in tables.candidates:
            if c.fixed or chosen.get(c.index, 0) >= c.r_max:
                continue
            trial = dict(chosen)
            trial[c.index] = trial.get(c.index, 0) + 1
            adds.append((delta(trial, {c.model}), c.index))
        removals.sort()
        adds.sort()
        applied = False
        for da, a in adds[:16]:
            if da >= -_EPS:
                break
            ca = tables.candidates[a]
            trial = dict(chosen)
            trial[a] = trial.get(a, 0) + 1
            moves: list[tuple[float, Choice]] = []
            if ok(trial, ca):  # free capacity: just add
                moves.append((da, trial))
            else:  # free room in the pool by removing its cheapest replicas
                t2, total = dict(trial), da
                for dr, rm in removals:
                    if total >= -_EPS:
                        break
                    crm = tables.candidates[rm]
                    if crm.pool != ca.pool or rm == a or t2.get(rm, 0) <= 0:
                        continue
                    t2[rm] -= 1
                    total += dr
                    if ok(t2, ca):
                        if total < -_EPS:
                            moves.append((total, t2))
                        break
            for _, t2 in sorted(moves, key=lambda x: x[0]):
                if uncovered(tables, t2) > uncovered(tables, chosen):
                    continue
                models = {tables.candidates[i].model for i in set(t2) | set(chosen)
                          if t2.get(i, 0) != chosen.get(i, 0)}
                d = delta(t2, models)
                if d < -_EPS:
                    chosen = {i: r for i, r in t2.items() if r > 0 or tables.candidates[i].fixed}
                    for m in models:
                        value[m] = model_value(tables, chosen, m)
                    applied = True
                    break
            if applied:
                break
        if not applied:
            return chosen
    return chosen
