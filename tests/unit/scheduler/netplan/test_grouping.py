"""Alg. 2's grouping against the exhaustive optimum on <= 8 GPUs, and the k-means laws."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from llmfabric.scheduler.netplan.grouping import (
    constrained_kmeans,
    group_cost,
    heroserve_groups,
    perturb,
)
from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import Topology

pytestmark = pytest.mark.unit


def random_fabric(seed: int, n: int = 8) -> Topology:
    """n GPUs on 2-4 hosts (NVLink of random speed inside), NICs of 25-100 Gbps on two
    access switches, one core switch with a random uplink: seeded."""
    rng = random.Random(seed)
    t = Topology()
    for s in ("acc0", "acc1", "core"):
        t.add_switch(s, 4)
    hosts = rng.choice([2, 4])
    per = n // hosts
    for k in range(n):
        t.add_gpu(f"g{k}", "A100-80GB", f"h{k // per}")
        t.add_edge(f"g{k}", f"acc{rng.randrange(2)}", "ethernet",
                   gbps=rng.choice([25, 50, 100]), latency_s=rng.uniform(0.5e-6, 3e-6))
    for h in range(hosts):
        mates = [f"g{k}" for k in range(h * per, (h + 1) * per)]
        gbs = rng.choice([50, 150, 300])
        for a, b in itertools.combinations(mates, 2):
            t.add_edge(a, b, "nvlink", gbs=gbs, latency_s=2e-6)
    for a in ("acc0", "acc1"):
        t.add_edge(a, "core", "ethernet", gbps=rng.choice([100, 200, 400]), latency_s=1e-6)
    return t


def partitions(items: list[int], size: int) -> list[list[list[int]]]:
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for mates in itertools.combinations(rest, size - 1):
        left = [x for x in rest if x not in mates]
        for tail in partitions(left, size):
            out.append([[first, *mates], *tail])
    return out


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("tp,nbytes", [(4, 512 * 8192 * 2.0), (2, 16 * 8192 * 2.0),
                                       (4, 8 * 8192 * 2.0)])
def test_grouping_within_5_percent_of_exhaustive(seed: int, tp: int, nbytes: float) -> None:
    topo = random_fabric(seed)
    gpus = topo.gpus()
    problem = NetProblem.of(topo, "llama-3.1-8b", gpus[:1], gpus[1:2],
                            NetWorkload(1.0, 512, 128), 10.0, 1.0, seed=seed)
    routes = Routes(topo, 1 << 20)
    cost = group_cost(problem, nbytes, routes)
    optimum = min(sum(cost([gpus[i] for i in g]) for g in part)
                  for part in partitions(list(range(len(gpus))), tp))
    groupings, sweeps = heroserve_groups(problem, gpus, tp, len(gpus) // tp, nbytes, routes)
    groups = groupings[0]  # Alg. 2's cheapest; the others are dearer or tie
    totals = [sum(cost(g) for g in gs) for gs in groupings]
    assert all(t >= totals[0] - 1e-15 for t in totals)
    assert len({repr(sorted(map(sorted, gs))) for gs in groupings}) == len(groupings)
    got = sum(cost(g) for g in groups)
    assert sorted(g for grp in groups for g in grp) == sorted(gpus)
    assert all(len(g) == tp for g in groups)
    assert got <= optimum * 1.05 + 1e-15
    assert 1 <= sweeps <= 5
    again, _ = heroserve_groups(problem, gpus, tp, len(gpus) // tp, nbytes, routes)
    assert again == groupings  # deterministic for a seed


def test_constrained_kmeans_exact_sizes_and_clusters() -> None:
    rng = np.random.default_rng(1)
    blobs = np.concatenate([rng.normal(c, 0.1, size=(4, 2)) for c in (0.0, 5.0, 10.0)])
    res = constrained_kmeans(blobs, 4, 3, seed=0)
    assert sorted(res.groups) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # unequal natural clusters are still cut into equal sizes
    pts = [[0.0], [0.1], [0.2], [10.0]]
    res2 = constrained_kmeans(pts, 2, 2, seed=3)
    assert all(len(g) == 2 for g in res2.groups)
    # more points than k x size: the flow leaves the outlier out
    res3 = constrained_kmeans([[0.0], [0.1], [50.0]], 2, 1, seed=0)
    assert res3.groups == [[0, 1]]
    with pytest.raises(SpecError):
        constrained_kmeans(pts, 3, 2)


def test_perturb_never_worsens_and_finds_the_swap() -> None:
    weights = {0: 1.0, 1: 1.0, 2: 9.0, 3: 9.0}

    def cost(g: list[int] | tuple[int, ...]) -> float:
        return max(weights[x] for x in g) - min(weights[x] for x in g)

    res = perturb([[0, 2], [1, 3]], cost, np.random.default_rng(0))
    assert sorted(res.groups) == [[0, 1], [2, 3]]
    assert res.swaps >= 1 and res.sweeps <= 5
