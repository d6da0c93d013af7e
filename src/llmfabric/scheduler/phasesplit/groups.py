"""Group construction and phase designation: the tabu search's solutions and moves
(ThunderServe Algorithm 1, Fig. 4; COMPANIONS.md §1.2 and Appendix A.2).

A group is a frozenset of GPU ids with a phase; a solution is a canonical tuple of groups
(sorted by smallest id). Moves: flip a phase, split a group (per type, the first floor(r x
count) GPUs by (host, id) to one part), merge two groups, move k GPUs of one type from group i
to group j (those with the best affinity to j: j's dominant host first, then bandwidth).
New groups get random phases. The start is average-linkage clustering on d_ij = 1/bw_ij cut at
the largest number of clusters (>= 2) in which every cluster holds a replica.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmfabric.scheduler.errors import InfeasibleError
from llmfabric.scheduler.phasesplit.problem import CloudCluster

PHASES = ("prefill", "decode")
MOVES = ("flip", "split", "merge", "move")


@dataclass(frozen=True, slots=True, order=True)
class Group:
    gpus: frozenset[int]
    phase: str

    def sort_key(self) -> tuple[int, str]:
        return (min(self.gpus), self.phase)


Solution = tuple[Group, ...]
Feasible = Callable[[frozenset[int], str], bool]


def canonical(groups: Sequence[Group]) -> Solution:
    return tuple(sorted(groups, key=Group.sort_key))


def solution_key(sol: Sequence[Group]) -> frozenset[tuple[frozenset[int], str]]:
    return frozenset((g.gpus, g.phase) for g in sol)


def early_ok(sol: Sequence[Group], feasible: Feasible) -> bool:
    """No empty group, >= 1 prefill and >= 1 decode group, every group holds a replica."""
    if any(not g.gpus for g in sol):
        return False
    phases = {g.phase for g in sol}
    if "prefill" not in phases or "decode" not in phases:
        return False
    return all(feasible(g.gpus, g.phase) for g in sol)


def _phase(rng: np.random.Generator) -> str:
    return PHASES[int(rng.integers(2))]


def neighbour(sol: Solution, cluster: CloudCluster, rng: np.random.Generator,
              weights: Sequence[float] = (1, 1, 1, 1)) -> tuple[str, Solution | None]:
    """One random move; (move name, new solution or None when the move does not apply)."""
    w = np.asarray(weights, dtype=np.float64)
    move = MOVES[int(rng.choice(4, p=w / w.sum()))]
    groups = list(sol)
    if move == "flip":
        k = int(rng.integers(len(groups)))
        g = groups[k]
        groups[k] = Group(g.gpus, "decode" if g.phase == "prefill" else "prefill")
    elif move == "split":
        k = int(rng.integers(len(groups)))
        r = float(rng.uniform())
        part_a: list[int] = []
        part_b: list[int] = []
        by_type: dict[str, list[int]] = {}
        for gid in sorted(groups[k].gpus, key=lambda i: (cluster.gpus[i].host, i)):
            by_type.setdefault(cluster.gpus[gid].type, []).append(gid)
        for ids in by_type.values():
            cut = int(np.floor(len(ids) * r))
            part_a += ids[:cut]
            part_b += ids[cut:]
        if not part_a or not part_b:
            return move, None
        groups[k:k + 1] = [Group(frozenset(part_a), _phase(rng)),
                           Group(frozenset(part_b), _phase(rng))]
    elif move == "merge":
        if len(groups) < 2:
            return move, None
        i, j = (int(v) for v in rng.choice(len(groups), 2, replace=False))
        merged = Group(groups[i].gpus | groups[j].gpus, _phase(rng))
        groups = [g for k, g in enumerate(groups) if k not in (i, j)] + [merged]
    else:  # move
        if len(groups) < 2:
            return move, None
        i, j = (int(v) for v in rng.choice(len(groups), 2, replace=False))
        src, dst = groups[i], groups[j]
        types = sorted({cluster.gpus[g].type for g in src.gpus})
        t = types[int(rng.integers(len(types)))]
        of_type = [g for g in src.gpus if cluster.gpus[g].type == t]
        k = int(rng.integers(1, len(of_type) + 1))
        hosts = Counter(cluster.gpus[g].host for g in dst.gpus)
        home = max(sorted(hosts), key=lambda h: hosts[h])
        dst_ids = sorted(dst.gpus)

        def affinity(g: int) -> tuple[int, float, int]:
            bw = float(np.mean(cluster.bandwidth[g, dst_ids]))
            return (0 if cluster.gpus[g].host == home else 1, -bw, g)

        chosen = frozenset(sorted(of_type, key=affinity)[:k])
        groups[j] = Group(dst.gpus | chosen, dst.phase)
        rest = src.gpus - chosen
        groups[i] = Group(rest, src.phase)
        groups = [g for g in groups if g.gpus]
    return move, canonical(groups)


def _average_linkage(cluster: CloudCluster) -> list[list[frozenset[int]]]:
    """Clusterings from n singletons down to one cluster (index k: n - k clusters)."""
    n = len(cluster.gpus)
    bw = cluster.bandwidth
    dist = np.where(np.isfinite(bw), 1.0 / np.maximum(bw, 1e-300), 0.0)
    clusters = [frozenset([i]) for i in range(n)]
    out = [list(clusters)]
    while len(clusters) > 1:
        best: tuple[float, int, int] | None = None
        for a in range(len(clusters)):
            ia = sorted(clusters[a])
            for b in range(a + 1, len(clusters)):
                d = float(dist[np.ix_(ia, sorted(clusters[b]))].mean())
                if best is None or d < best[0] - 1e-15:
                    best = (d, a, b)
        assert best is not None
        _, a, b = best
        merged = clusters[a] | clusters[b]
        clusters = [c for k, c in enumerate(clusters) if k not in (a, b)] + [merged]
        clusters.sort(key=min)
        out.append(list(clusters))
    return out


def initial_solution(cluster: CloudCluster, feasible: Feasible,
                     rng: np.random.Generator) -> Solution:
    """Clustering start; raises InfeasibleError when no cut into >= 2 groups holds the model
    in every group."""
    for clusters in _average_linkage(cluster):
        if len(clusters) < 2:
            break
        if all(feasible(c, "decode") or feasible(c, "prefill") for c in clusters):
            for _ in range(1000):
                sol = canonical([Group(c, _phase(rng)) for c in clusters])
                if early_ok(sol, feasible):
                    return sol
    raise InfeasibleError("no split of the GPUs into >= 2 groups holds one model replica per "
                          "group: add GPUs or pick a smaller model")
