"""Exact load splits for fixed replica counts in the level and convex formulations.

The counterparts of the CP-SAT level and convex formulations restricted to given replica
counts: knapsack DPs over covered load units (capped at the model's total). `split_levels`
gives each replica a level (or none); `split_convex` gives each group a load under its
envelope cuts. Used for the solver's hint and by the exhaustive enumerator.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from llmfabric.scheduler.tables import Tables

_INF = np.iinfo(np.int64).max // 4


def split_levels(tables: Tables, chosen: Mapping[int, int], model: str
                 ) -> tuple[int, dict[int, list[int]], int]:
    """(value, {candidate: replicas per level}, unserved units) minimizing latency units."""
    units = tables.u
    levels = tables.levels
    items = [(i, r) for i, r in sorted(chosen.items())
             if r > 0 and tables.candidates[i].model == model]
    best = np.full(units + 1, _INF, dtype=np.int64)
    best[0] = 0
    steps: list[tuple[int, np.ndarray, np.ndarray]] = []  # (candidate, level idx+1 or 0, prev)
    for i, r in items:
        costs = tables.lvl_lat[i]
        for _ in range(r):
            new = best.copy()  # idle replica
            choice = np.zeros(units + 1, dtype=np.int64)
            prev = np.arange(units + 1, dtype=np.int64)
            for k, lv in enumerate(levels):
                cand = np.full(units + 1, _INF, dtype=np.int64)
                cand[lv:] = best[: units + 1 - lv] + costs[k]
                src = np.arange(units + 1, dtype=np.int64) - lv
                tail = best[units - lv:]  # every c >= units - lv lands on `units`
                j = int(np.argmin(tail))
                if tail[j] + costs[k] < cand[units]:
                    cand[units] = tail[j] + costs[k]
                    src[units] = units - lv + j
                better = cand < new
                new = np.where(better, cand, new)
                choice = np.where(better, k + 1, choice)
                prev = np.where(better, src, prev)
            best = new
            steps.append((i, choice, prev))
    pen = tables.level_pen(model)
    totals = best + (units - np.arange(units + 1, dtype=np.int64)) * pen
    c = int(np.argmin(totals))
    value = int(totals[c])
    counts: dict[int, list[int]] = {i: [0] * len(levels) for i, _ in items}
    unserved = units - c
    for i, choice, prev in reversed(steps):
        k = int(choice[c])
        if k:
            counts[i][k - 1] += 1
        c = int(prev[c])
    return value, counts, unserved


def split_convex(tables: Tables, chosen: Mapping[int, int], model: str) -> tuple[int, int]:
    """(value, unserved units) of the convex formulation for fixed replica counts: each
    candidate takes w units at cost max(0, max_j a_j*w + b_j*r); a DP over covered units."""
    units = tables.u
    w = np.arange(units + 1, dtype=np.int64)
    best = np.full(units + 1, _INF, dtype=np.int64)
    best[0] = 0
    for i, r in sorted(chosen.items()):
        if r <= 0 or tables.candidates[i].model != model:
            continue
        cost = np.zeros(units + 1, dtype=np.int64)
        for a, b in tables.hull[i]:
            cost = np.maximum(cost, a * w + b * r)
        new = np.full(units + 1, _INF, dtype=np.int64)
        for c in range(units + 1):
            if best[c] >= _INF:
                continue
            dest = np.minimum(units, c + w)
            np.minimum.at(new, dest, best[c] + cost)
        best = new
    pen = tables.level_pen(model)
    totals = best + (units - w) * pen
    c = int(np.argmin(totals))
    return int(totals[c]), units - c


def split_envelope(tables: Tables, chosen: Mapping[int, int], model: str
                   ) -> tuple[float, dict[int, float], float]:
    """(value, {candidate: load units}, unserved units) of the best continuous split of
    `model`'s load over groups priced by their convex envelopes (`tables.hull_pts`): r
    replicas sharing w units cost r * env(w / r). The cost is convex and piecewise linear, so
    filling segments in order of slope is exact (the convex formulation's value, without its
    integer rounding); load whose cheapest slope is the unserved penalty stays unserved."""
    units = float(tables.u)
    pen = float(tables.level_pen(model))
    segments: list[tuple[float, float, int]] = []  # (slope, length in units, candidate)
    for i, r in chosen.items():
        if r <= 0 or tables.candidates[i].model != model:
            continue
        pts = tables.hull_pts[i]
        for (x1, y1), (x2, y2) in itertools.pairwise(pts):
            segments.append(((y2 - y1) / (x2 - x1), r * (x2 - x1), i))
    segments.sort()
    left, value = units, 0.0
    taken: dict[int, float] = {}
    for slope, length, i in segments:
        if left <= 0 or slope >= pen:
            break
        w = min(length, left)
        taken[i] = taken.get(i, 0.0) + w
        value += slope * w
        left -= w
    return value + left * pen, taken, left
