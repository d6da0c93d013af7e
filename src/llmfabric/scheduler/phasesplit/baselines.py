"""What ThunderServe is compared with on the same GPUs (`plan pd --compare`, benchmarks):

- `best_fixed_split`: the clustering start's groups (one per instance, as deployed by hand),
  the best phase vector over them (exhaustive for <= 12 groups) and LP routing: a fixed P:D
  split with no group search.
- `colocated_cpsat`: the project's CP-SAT placement of the model on the same GPU pools
  (colocated prefill+decode replicas, TP x DP per GPU type, OpenTela §3.5), simulated with
  the same workload and SLO (no KV transfers: colocation needs none).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from llmfabric.scheduler.phasesplit.config import ConfigSearch
from llmfabric.scheduler.phasesplit.groups import Group, canonical, initial_solution
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.reschedule import lightweight
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.serving import ReplicaSpec, simulate_cluster
from llmfabric.sim.workload import poisson


def best_fixed_split(cluster: CloudCluster, model: ModelSpec | str, workload: PDWorkload,
                     options: TabuOptions | None = None) -> PDPlan:
    opts = options or TabuOptions()
    spec = get_model(model)
    cs = ConfigSearch(cluster, spec, workload, pipelined_pp=opts.pipelined_pp)

    def feasible(g: frozenset[int], p: str) -> bool:
        return cs.deduce(g, p) is not None  # type: ignore[arg-type]

    start = initial_solution(cluster, feasible, np.random.default_rng(opts.seed))
    # every group starts as prefill-able and decode-able; lightweight picks the phases
    both = canonical([Group(g.gpus, g.phase) for g in start])
    plan = tabu_search(cluster, spec, workload, TabuOptions(
        n_step=0, seed=opts.seed, kv_bits=opts.kv_bits, kv_group=opts.kv_group,
        pipelined_pp=opts.pipelined_pp, headroom=opts.headroom), start=both, search=cs)
    return lightweight(plan, workload=workload, options=opts)[0]


@dataclass(frozen=True, slots=True)
class ColocatedResult:
    groups: tuple[tuple[str, int, int], ...]   # (GPU type, TP, replicas)
    attainment: float
    throughput_rps: float
    mean_ttft_s: float
    mean_tpot_s: float


def colocated_cpsat(cluster: CloudCluster, model: ModelSpec | str, workload: PDWorkload, *,
                    duration_s: float = 300.0, seed: int = 0,
                    time_limit_s: float = 10.0) -> ColocatedResult:
    from llmfabric.scheduler.options import PlacementOptions
    from llmfabric.scheduler.policies import get_policy
    from llmfabric.scheduler.problem import Cluster, ModelLoad, Pool, Problem, Workload
    from llmfabric.scheduler.simadapter import SimPerformance
    from llmfabric.scheduler.tables import build_tables

    spec = get_model(model)
    per_host = Counter((g.host, g.type) for g in cluster.gpus)
    pools: dict[tuple[str, int], int] = Counter()
    for (_, gpu_type), count in per_host.items():
        pools[(gpu_type, count)] += 1
    pool_list = tuple(Pool(f"{t}x{n}", t, nodes, n, interconnect="pcie")
                      for (t, n), nodes in sorted(pools.items()))
    wl = Workload((ModelLoad(spec.name, workload.rate, workload.mean_in, workload.mean_out,
                             float(np.std(workload.in_lengths)),
                             float(np.std(workload.out_lengths))),))
    problem = Problem(Cluster(pool_list), wl)
    perf = SimPerformance.for_workload(wl)
    options = PlacementOptions(time_limit_s=time_limit_s, workers=2)
    placement = get_policy("cpsat")(problem, perf, options, build_tables(problem, perf, options))
    replicas = []
    groups = []
    for g in placement.groups:
        groups.append((g.gpu_type, g.tp, g.replicas))
        replicas += [ReplicaSpec.of(spec, g.gpu_type, g.tp)] * g.replicas
    if not replicas:
        return ColocatedResult((), 0.0, 0.0, float("nan"), float("nan"))
    trace = poisson(workload.rate, duration_s, workload.in_lengths, workload.out_lengths, seed)
    res = simulate_cluster(replicas, trace, slo=workload.slo, seed=seed)
    return ColocatedResult(tuple(groups), float(res.slo_attainment),
                           float(res.throughput_rps), float(res.mean_ttft_s),
                           float(res.mean_tpot_s))
