"""GPU grouping for tensor parallelism (HeroServe Alg. 2, lines 4 and 12-22).

`constrained_kmeans(points, size, k, seed, restarts)`: Lloyd iterations whose assignment
step is a min-cost flow (OR-Tools `SimpleMinCostFlow`: source -> point (cap 1), point ->
cluster (cap 1, cost = squared distance scaled to integers), cluster -> sink (cap `size`)),
so every cluster gets exactly `size` points; with more points than k x size the flow also
picks which stay out. Seeded restarts (k-means++-style seeding), lowest inertia wins.

`perturb(groups, cost, rng, max_sweeps)`: pairwise swaps between groups, accepted when the
two groups' summed cost drops (T_n sums the groups' latencies, eq. 5), or it ties and their
larger cost drops (the paper accepts when the chosen group improves, which can worsen its
partner and T_n).
Moves exchange one or two members between two groups (single exchanges alone leave
2-for-2 local optima on 8 GPUs). A sweep tries up to `attempts_per_group` x #groups moves
(COMPANIONS §3.4: 5),
distinct, in a seeded order (all of them when there are fewer); it stops after a sweep
without an improving swap or after `max_sweeps`.

`heroserve_groups` (Alg. 2 for the planner): k-means on the rows of the latency matrix,
each distinct restart and the host-order grouping (`host_order_groups`, DistServe's) perturbed
under `group_cost` (a group's all-reduce time, the cheaper of INA and ring); every distinct
result is a candidate grouping, cheapest first, for the planner to price end to end.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from ortools.graph.python import min_cost_flow

from llmfabric.scheduler.netplan.commcost import choose_scheme
from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.problem import NetProblem
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import NodeId

FloatArray = npt.NDArray[np.float64]
_SCALE = 1e6  # integer costs for the flow: squared distances relative to the largest


def _assign(points: FloatArray, centres: FloatArray, size: int) -> list[int]:
    """Min-cost assignment of points to centres, exactly `size` per centre; -1 = left out."""
    n, k = len(points), len(centres)
    d2 = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
    top = float(d2.max()) or 1.0
    cost = np.rint(d2 / top * _SCALE).astype(np.int64)
    flow = min_cost_flow.SimpleMinCostFlow()
    src, sink = n + k, n + k + 1
    for p in range(n):
        flow.add_arc_with_capacity_and_unit_cost(src, p, 1, 0)
        for c in range(k):
            flow.add_arc_with_capacity_and_unit_cost(p, n + c, 1, int(cost[p, c]))
    for c in range(k):
        flow.add_arc_with_capacity_and_unit_cost(n + c, sink, size, 0)
    flow.set_node_supply(src, k * size)
    flow.set_node_supply(sink, -k * size)
    if flow.solve() != flow.OPTIMAL:
        raise SpecError("constrained k-means: the assignment flow has no solution")
    label = [-1] * n
    for arc in range(flow.num_arcs()):
        t, h = flow.tail(arc), flow.head(arc)
        if t < n and n <= h < n + k and flow.flow(arc) > 0:
            label[t] = h - n
    return label


def _seed_centres(points: FloatArray, k: int, rng: np.random.Generator) -> FloatArray:
    first = int(rng.integers(len(points)))
    centres = [points[first]]
    while len(centres) < k:
        d2 = np.min([((points - c) ** 2).sum(axis=1) for c in centres], axis=0)
        total = float(d2.sum())
        idx = int(rng.integers(len(points))) if total <= 0 else int(
            rng.choice(len(points), p=d2 / total))
        centres.append(points[idx])
    return np.array(centres, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Clustering:
    groups: list[list[int]]  # point indices per cluster, each sorted
    inertia: float
    restarts: list[list[list[int]]] = field(default_factory=list)  # distinct, best first


def constrained_kmeans(points: Sequence[Sequence[float]] | FloatArray, size: int, k: int,
                       seed: int = 0, restarts: int = 10, max_iter: int = 100) -> Clustering:
    """k clusters of exactly `size` points each (k x size <= len(points))."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or not np.all(np.isfinite(pts)):
        raise SpecError("constrained_kmeans needs a finite 2-D array of points")
    if size < 1 or k < 1 or k * size > len(pts):
        raise SpecError(f"cannot make {k} clusters of {size} from {len(pts)} points")
    rng = np.random.default_rng(seed)
    best: Clustering | None = None
    seen: dict[str, tuple[float, list[list[int]]]] = {}
    for _ in range(max(1, restarts)):
        centres = _seed_centres(pts, k, rng)
        label: list[int] = []
        for _ in range(max_iter):
            new = _assign(pts, centres, size)
            if new == label:
                break
            label = new
            centres = np.array([pts[[p for p, c in enumerate(label) if c == j]].mean(axis=0)
                                for j in range(k)])
        inertia = float(sum(((pts[p] - centres[c]) ** 2).sum()
                            for p, c in enumerate(label) if c >= 0))
        groups = sorted(sorted(p for p, c in enumerate(label) if c == j) for j in range(k))
        seen.setdefault(repr(groups), (inertia, groups))
        if best is None or inertia < best.inertia - 1e-12:
            best = Clustering(groups, inertia)
    assert best is not None
    ranked = [g for _, g in sorted(seen.values(), key=lambda x: x[0])]
    return Clustering(best.groups, best.inertia, ranked)


@dataclass(frozen=True, slots=True)
class Perturbed:
    groups: list[list[int]]
    sweeps: int  # sweeps run, including the last one that found nothing
    swaps: int


def perturb(groups: Sequence[Sequence[int]], cost: Callable[[Sequence[int]], float],
            rng: np.random.Generator, max_sweeps: int = 5,
            attempts_per_group: int = 5) -> Perturbed:
    """Improve a grouping by swapping members between two groups (see the module doc)."""
    gs = [list(g) for g in groups]
    costs = [cost(g) for g in gs]
    sweeps = swaps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        # one-for-one and two-for-two exchanges between two groups
        moves: list[tuple[int, tuple[int, ...], int, tuple[int, ...]]] = []
        for a in range(len(gs)):
            for b in range(a + 1, len(gs)):
                for r in (1, 2):
                    if r > min(len(gs[a]), len(gs[b])) - (1 if r > 1 else 0):
                        continue
                    for ia in itertools.combinations(range(len(gs[a])), r):
                        for jb in itertools.combinations(range(len(gs[b])), r):
                            moves.append((a, ia, b, jb))
        order = rng.permutation(len(moves))[:attempts_per_group * len(gs)]
        improved = False
        for m in order:
            a, ia, b, jb = moves[int(m)]
            ga, gb = list(gs[a]), list(gs[b])
            for i, j in zip(ia, jb, strict=True):
                ga[i], gb[j] = gb[j], ga[i]
            ca, cb = cost(ga), cost(gb)
            old_sum, new_sum = costs[a] + costs[b], ca + cb
            if new_sum < old_sum - 1e-15 or (new_sum <= old_sum + 1e-15
                                              and max(ca, cb) < max(costs[a], costs[b]) - 1e-15):
                gs[a], gs[b], costs[a], costs[b] = ga, gb, ca, cb
                swaps += 1
                improved = True
        if not improved:
            break
    return Perturbed([sorted(g) for g in gs], sweeps, swaps)


# --- HeroServe's grouping (Alg. 2) -----------------------------------------------------
def group_cost(problem: NetProblem, nbytes: float, routes: Routes
               ) -> Callable[[Sequence[NodeId]], float]:
    """A TP group's all-reduce time at `nbytes`, the cheaper of INA and ring (eq. 5's
    term; memoised per member set)."""
    memo: dict[tuple[NodeId, ...], float] = {}

    def cost(group: Sequence[NodeId]) -> float:
        k = tuple(sorted(group, key=str))
        if k not in memo:
            c = choose_scheme(problem.topology, group, nbytes,
                              hop_latency=problem.hop_latency, routes=routes,
                              net_s=problem.net_collective_s, spread=True)
            memo[k] = min(c.t_ina, c.t_ring)
        return memo[k]
    return cost


def host_order_groups(problem: NetProblem, gpus: Sequence[NodeId], tp: int,
                      n_groups: int) -> list[list[NodeId]]:
    """DistServe's placement: GPUs in topology order (server mates together), chunks of tp."""
    index = {g: k for k, g in enumerate(problem.topology.gpus())}
    ordered = sorted(gpus, key=lambda g: index[g])
    return [ordered[k * tp:(k + 1) * tp] for k in range(n_groups)]


def heroserve_groups(problem: NetProblem, gpus: Sequence[NodeId], tp: int, n_groups: int,
                     nbytes: float, routes: Routes) -> tuple[list[list[list[NodeId]]], int]:
    """Alg. 2: constrained k-means on the rows of the latency matrix, then perturbation of
    every distinct restart's grouping and of the host-order grouping. Every distinct result
    is a candidate, cheapest first (sum of group latencies, eq. 5; ties in start order):
    `planner.evaluate` prices each with the whole model and keeps the one with the largest
    H, so a grouping that eq. 5 cannot tell apart but that loads a shared link worse (e.g.
    all of an instance's KV through one uplink) is not kept."""
    if tp == 1:
        return [[[g] for g in gpus[:n_groups]]], 0
    feats = np.array([[routes.route(a, b).time(nbytes, problem.hop_latency) for b in gpus]
                      for a in gpus])
    km = constrained_kmeans(feats, tp, n_groups, seed=problem.seed, restarts=problem.restarts)
    starts = [[[gpus[p] for p in grp] for grp in start] for start in km.restarts]
    starts.append(host_order_groups(problem, gpus, tp, n_groups))
    cost = group_cost(problem, nbytes, routes)
    found: dict[str, tuple[float, int, list[list[NodeId]]]] = {}
    sweeps = 0
    index = {g: k for k, g in enumerate(gpus)}
    for n, start in enumerate(starts):
        rng = np.random.default_rng(problem.seed)
        res = perturb([[index[g] for g in grp] for grp in start],
                      lambda grp: cost([gpus[p] for p in grp]), rng, problem.max_sweeps)
        sweeps = max(sweeps, res.sweeps)
        groups = [[gpus[p] for p in grp] for grp in res.groups]
        total = sum(cost(g) for g in groups)
        found.setdefault(repr(sorted(res.groups)), (total, n, groups))
    left, ranked = sorted(found.values(), key=lambda t: t[1]), []
    while left:  # cheapest first; within 1e-15 s the earlier start (as a strict '<' keeps)
        low = min(t[0] for t in left)
        ranked.append(left.pop(next(i for i, t in enumerate(left) if t[0] <= low + 1e-15)))
    return [groups for _, _, groups in ranked], sweeps
