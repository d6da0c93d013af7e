"""Exhaustive enumeration for small instances: the reference optimum CP-SAT is tested against.

Enumerates, for every (model, pool), either nothing or one (TP, replicas) choice, keeps the
combinations that pack, and scores each with the per-model optimal load split — exactly the
solver's model (same tables, same coverage-first rule), so the optima must be equal.
"""

from __future__ import annotations

import itertools

from llmfabric.scheduler.baselines import Choice
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.levels import split_convex, split_levels
from llmfabric.scheduler.placement import capacity_ok, split_load
from llmfabric.scheduler.tables import Tables


def exhaustive(tables: Tables, max_combinations: int = 2_000_000, scorer: str = "table"
               ) -> tuple[int, Choice]:
    """(latency units, choice) of the coverage-first optimum (latency objective only).

    `scorer`: "table" (equal split per group, the table formulation's units), "levels"
    (per-replica load levels) or "convex" (convex-envelope cuts), each in its
    formulation's units."""
    slots: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (model, pool) -> [(cand, r)]
    fixed: Choice = {}
    for c in tables.candidates:
        if c.fixed:
            fixed[c.index] = c.r_min
            continue
        opts = slots.setdefault((c.model, c.pool), [])
        if tables.options.one_tp_per_pool or not opts:
            opts.extend((c.index, r) for r in range(1, c.r_max + 1))
        else:
            raise SpecError("exhaustive() supports one_tp_per_pool=True only")
    keys = list(slots)
    space = 1
    for k in keys:
        space *= len(slots[k]) + 1
    if space > max_combinations:
        raise SpecError(f"{space} combinations is too many for exhaustive search; use cpsat")
    pools = {p.name: p for p in tables.problem.cluster.pools}
    best: tuple[int, int, Choice] | None = None  # (uncovered, latency units, choice)
    for combo in itertools.product(*[[None, *slots[k]] for k in keys]):
        chosen = dict(fixed)
        for pick in combo:
            if pick is not None:
                chosen[pick[0]] = pick[1]
        per_pool: dict[str, list[tuple[int, int]]] = {}
        for i, r in chosen.items():
            c = tables.candidates[i]
            if not c.fixed:
                per_pool.setdefault(c.pool, []).append((c.tp, r))
        if not all(capacity_ok(pools[p], used) for p, used in per_pool.items()):
            continue
        models_with = {tables.candidates[i].model for i, r in chosen.items() if r}
        coverable = {c.model for c in tables.candidates}
        uncovered = len(coverable - models_with)
        if scorer == "convex":
            value = sum(split_convex(tables, chosen, m)[0] for m in tables.loads)
        elif scorer == "levels":
            value = sum(split_levels(tables, chosen, m)[0] for m in tables.loads)
        else:
            value = sum(split_load(tables, chosen, m)[0] for m in tables.loads)
        if best is None or (uncovered, value) < (best[0], best[1]):
            best = (uncovered, value, chosen)
    if best is None:
        raise SpecError("no combination packs; the cluster is empty")
    return best[1], best[2]
