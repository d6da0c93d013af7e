"""Scoring a solution: configs per group (Algorithm 2), then routing (LP) and attainment,
analytic (inside the tabu) or by the discrete-event simulator (final plan, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmfabric.scheduler.phasesplit.config import ConfigSearch, GroupConfig, ReplicaConfig
from llmfabric.scheduler.phasesplit.groups import Group
from llmfabric.scheduler.phasesplit.orchestrate import PairModel, Routing
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.scheduler.phasesplit.stability import HEADROOM, QueueTrend, queue_trend
from llmfabric.sim.engine import EngineConfig
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.parallel import Link
from llmfabric.sim.pdrouting import PDRouting
from llmfabric.sim.serving import ReplicaSpec, simulate_disaggregated
from llmfabric.sim.workload import poisson

SIM_DURATION_S = 300.0


@dataclass(frozen=True, eq=False)
class Evaluated:
    groups: tuple[Group, ...]
    configs: tuple[GroupConfig, ...]
    routing: Routing
    prefill: tuple[ReplicaConfig, ...]
    decode: tuple[ReplicaConfig, ...]

    @property
    def attainment(self) -> float:
        return self.routing.attainment


@dataclass(frozen=True, slots=True)
class PlanScore:
    attainment: float
    throughput_rps: float
    mean_ttft_s: float
    mean_tpot_s: float
    trend: QueueTrend | None = None  # first vs second half of the window (simulator only)


def replicas_of(groups: Sequence[Group], configs: Sequence[GroupConfig], phase: str
                ) -> tuple[ReplicaConfig, ...]:
    return tuple(r for g, c in zip(groups, configs, strict=True) if g.phase == phase
                 for r in c.replica_configs)


def evaluate_groups(groups: Sequence[Group], search: ConfigSearch, cluster: CloudCluster,
                    model: ModelSpec, workload: PDWorkload, *, kv_bits: int | None,
                    kv_group: int, orchestrate: bool = True,
                    headroom: float = HEADROOM) -> Evaluated | None:
    """None when a group holds no replica of its phase."""
    configs = []
    for g in groups:
        cfg = search.deduce(g.gpus, g.phase)  # type: ignore[arg-type]
        if cfg is None:
            return None
        configs.append(cfg)
    pre, dec = replicas_of(groups, configs, "prefill"), replicas_of(groups, configs, "decode")
    if not pre or not dec:
        return None
    memo = search.pair_memo(cluster, workload, kv_bits, kv_group)
    pm = PairModel(pre, dec, cluster, model, workload, kv_bits, kv_group, memo,
                   headroom=headroom)
    return Evaluated(tuple(groups), tuple(configs), pm.route(orchestrate), pre, dec)


def replica_links(pre: Sequence[ReplicaConfig], dec: Sequence[ReplicaConfig],
                  cluster: CloudCluster) -> LinkMatrix:
    bw = np.zeros((len(pre), len(dec)))
    lat = np.zeros_like(bw)
    for i, p in enumerate(pre):
        for j, q in enumerate(dec):
            link = cluster.link(p.gpus, q.gpus)
            bw[i, j], lat[i, j] = link.bandwidth, link.latency_s
    return LinkMatrix(bw, lat)


def simulate(pre: Sequence[ReplicaConfig], dec: Sequence[ReplicaConfig], routing: Routing,
             cluster: CloudCluster, workload: PDWorkload, *, kv_bits: int | None,
             kv_group: int, pipelined_pp: bool = True, duration_s: float = SIM_DURATION_S,
             seed: int = 0, link_contention: bool = False) -> PlanScore:
    """The discrete-event simulator on the plan: PDRouting(X, Y), staged KV transfers over
    the stage-pair links. Requests the LP leaves unserved are dispatched anyway (by X)."""
    cfg = EngineConfig(pp_microbatch=pipelined_pp)
    pspecs = [ReplicaSpec(r.deployment, cfg, None, "prefill") for r in pre]
    dspecs = [ReplicaSpec(r.deployment, cfg, None, "decode") for r in dec]
    x = routing.x if routing.x.sum() > 0 else np.ones(len(pre))
    wl = poisson(workload.rate, duration_s, workload.in_lengths, workload.out_lengths, seed)

    def stage_link(i: int, j: int, sp: int, sd: int) -> Link:
        return cluster.link(pre[i].stages[sp].gpus, dec[j].stages[sd].gpus)

    res = simulate_disaggregated(pspecs, dspecs, wl, replica_links(pre, dec, cluster),
                                 routing=PDRouting(list(x), routing.y.tolist()),
                                 kv_bits=kv_bits, kv_group=kv_group, stage_link=stage_link,
                                 link_contention=link_contention, slo=workload.slo, seed=seed)
    trend = queue_trend(res.arrival_s, res.ttft_s, res.tpot_s, res.e2e_s, workload.slo,
                        duration_s)
    return PlanScore(float(res.slo_attainment), float(res.throughput_rps),
                     float(res.mean_ttft_s), float(res.mean_tpot_s), trend)
