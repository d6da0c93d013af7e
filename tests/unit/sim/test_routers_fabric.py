"""Simulator routers mean what the fabric's routing policies of the same name mean, plus the
prefix-aware routers (consistent hashing with bounded loads)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from llmfabric.routing.policies import POLICIES
from llmfabric.sim import EngineConfig, ReplicaSpec, SpecError, poisson, simulate_cluster
from llmfabric.sim.costs import cost_model
from llmfabric.sim.engine import Replica, RequestBook
from llmfabric.sim.routers import ROUTERS, make_router, replica_gpu_weight
from llmfabric.sim.workload import with_prefixes

M = "llama-3.1-8b"


def _replicas(loads: list[int], gpus: list[tuple[str, int]] | None = None,
              spare: int = 0) -> list[Replica]:
    gpus = gpus or [("H100", 1)] * len(loads)
    total = sum(loads) + 1 + spare  # (spare: ids from sum(loads) on, for later submits)
    book = RequestBook([0.0] * total, [100] * total, [10] * total)
    out = []
    rid = 0
    for k, ((gpu, tp), load) in enumerate(zip(gpus, loads, strict=True)):
        r = Replica(k, cost_model(M, gpu, tp), EngineConfig(), 100_000, book)
        for _ in range(load):
            r.submit(rid, 100, 10)  # queued: counts as outstanding
            rid += 1
        out.append(r)
    return out


def test_every_fabric_policy_name_is_a_sim_router() -> None:
    assert set(POLICIES) <= set(ROUTERS)
    with pytest.raises(SpecError, match="least_outstanding"):
        make_router("fastest")


def test_least_outstanding_is_power_of_two_choices() -> None:
    reps = _replicas([0, 5, 5])
    lo = make_router("least_outstanding", seed=3)
    picks = Counter(lo.pick(reps, 0, 100) for _ in range(3000))
    # index 0 wins whenever it is one of the two drawn: 2/3 of the time, never all of it
    assert picks[0] / 3000 == pytest.approx(2 / 3, abs=0.03)
    jsq = make_router("join_shortest_queue")
    assert all(jsq.pick(reps, 0, 100) == 0 for _ in range(50))
    # two replicas: both are always drawn, the less loaded always wins
    two = _replicas([4, 1])
    assert all(lo.pick(two, 0, 100) == 1 for _ in range(50))


def test_weighted_follows_gpu_class_times_count() -> None:
    reps = _replicas([0, 0, 0], [("H100", 1), ("A100-80GB", 2), ("V100", 1)])
    assert [replica_gpu_weight(r) for r in reps] == [4.0, 4.0, 0.7]
    w = make_router("weighted", seed=1)
    counts = np.bincount([w.pick(reps, 0, 1) for _ in range(8700)], minlength=3)
    assert counts / 8700 == pytest.approx(np.array([4, 4, 0.7]) / 8.7, abs=0.02)


def test_prefix_affinity_sticks_and_bounds_load() -> None:
    idle = _replicas([0, 0, 0, 0])
    prefixes = [7] * 10 + [8] * 10
    pa = make_router("prefix_affinity", prefixes=prefixes)
    home7 = {pa.pick(idle, rid, 1) for rid in range(10)}
    assert len(home7) == 1  # the same prefix lands on the same replica
    (h,) = home7
    # loads (h: 6, others 0): limit = ceil(1.25 * 7 / 4) = 3, so h is skipped
    loads = [6 if i == h else 0 for i in range(4)]
    busy = _replicas(loads)
    assert pa.pick(busy, 0, 1) != h
    plain = make_router("prefix_hash", prefixes=prefixes)
    assert plain.pick(busy, 0, 1) == h  # no bound: always the ring owner
    loose = make_router("prefix_bounded_load", prefixes=prefixes, eps=10.0)
    assert loose.pick(busy, 0, 1) == h  # limit ceil(11 * 7 / 4) = 20
    with pytest.raises(SpecError):
        make_router("prefix_bounded_load", eps=-1.0)


def test_prefix_routers_in_a_cluster_run() -> None:
    wl = with_prefixes(poisson(40, 20, 512, 64, seed=2), groups=8, skew=1.0, seed=1)
    assert wl.prefix_id is not None and wl.prefix_id.max() < 8
    specs = [ReplicaSpec.of(M, "H100")] * 4
    hashed = simulate_cluster(specs, wl, router="prefix_hash")
    bounded = simulate_cluster(specs, wl, router="prefix_bounded_load",
                               router_options={"eps": 0.1})
    assert hashed.n_completed == bounded.n_completed == len(wl)
    # one replica per group under plain hashing; the bound spreads a hot group
    per_group = {g: set(hashed.replica[wl.prefix_id == g].tolist()) for g in range(8)}
    assert all(len(v) <= 1 for v in per_group.values())
    assert np.bincount(bounded.replica, minlength=4).max() < np.bincount(
        hashed.replica, minlength=4).max()
    sub = wl.subset(wl.arrival_s < 5)
    assert sub.prefix_id is not None and len(sub.prefix_id) == len(sub)



@pytest.mark.parametrize("name", ["prefix_bounded", "cache_aware"])
def test_prefix_bounded_follows_the_group_until_the_bound(name: str) -> None:
    reps = _replicas([2, 2, 2, 2], spare=3)
    router = make_router(name, prefixes=[7] * 20)
    rid = 8
    picks = []
    for r in range(3):
        i = router.pick(reps, r, 100)
        picks.append(i)
        reps[i].submit(rid, 100, 10)
        rid += 1
    # cold: least loaded (0); then followed while 3 + 1 <= ceil(1.25 * 10 / 4) = 4; then
    # 4 + 1 > ceil(1.25 * 11 / 4) = 4: spills to the least loaded, which is remembered.
    assert picks == [0, 0, 1]
    assert router.pick(reps, 3, 100) == 1
