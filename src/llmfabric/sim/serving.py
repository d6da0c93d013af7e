"""Serving simulations: one replica, many replicas behind a router, prefill/decode split,
and the maximum sustainable rate under an SLO.

These are the entry points for the scheduler (`simulate_replica`, `simulate_cluster`,
`max_sustainable_rate`). Everything is deterministic for a given workload and seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmfabric.sim.calibration import Efficiency
from llmfabric.sim.costs import cost_model_for
from llmfabric.sim.engine import EngineConfig, Replica, RequestBook, Role
from llmfabric.sim.errors import InfeasibleError, SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.memory import memory_plan
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import Deployment, Link, kv_transfer_time, make_deployment
from llmfabric.sim.results import SLO, ServingResult, build_result
from llmfabric.sim.routers import make_router
from llmfabric.sim.workload import Workload, poisson, replay


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica of a cluster: its layout, engine settings and (optional) efficiency."""

    deployment: Deployment
    config: EngineConfig = field(default_factory=EngineConfig)
    efficiency: Efficiency | None = None
    role: Role = "both"

    @staticmethod
    def of(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, pp: int = 1,
           config: EngineConfig | None = None, role: Role = "both") -> ReplicaSpec:
        return ReplicaSpec(make_deployment(get_model(model), get_gpu(gpu), tp, pp),
                           config or EngineConfig(), None, role)


def _kv_capacity(spec: ReplicaSpec) -> int:
    cfg = spec.config
    if cfg.kv_capacity_tokens is not None:
        return cfg.kv_capacity_tokens
    util = 1.0 if cfg.kv_fraction_of_free > 0 else cfg.gpu_memory_utilization
    plan = memory_plan(spec.deployment, gpu_memory_utilization=util,
                       max_batched_tokens=cfg.max_batched_tokens, block_size=cfg.block_size)
    if not plan.fits:
        dep = spec.deployment
        raise InfeasibleError(
            f"{dep.model.name} does not fit on {[(s.gpu.name, s.tp) for s in dep.stages]}: "
            f"{plan.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU leave no KV space; "
            "raise tp/pp, pick a larger GPU or quantize"
        )
    if cfg.kv_fraction_of_free > 0:  # a share of what weights and runtime leave free
        blocks = int(plan.kv_capacity_tokens * cfg.kv_fraction_of_free) // cfg.block_size
        return blocks * cfg.block_size
    return plan.kv_capacity_tokens


def _replicas(specs: Sequence[ReplicaSpec], book: RequestBook, offset: int = 0) -> list[Replica]:
    out = []
    for i, spec in enumerate(specs):
        cost = cost_model_for(spec.deployment, spec.efficiency)
        out.append(Replica(offset + i, cost, spec.config, _kv_capacity(spec), book, spec.role))
    return out


def _dispatch(replicas: list[Replica], times: Sequence[float], rids: Sequence[int],
              prompts: Sequence[int], outputs: Sequence[int], router: str, seed: int,
              kv_ready: bool = False) -> None:
    policy = make_router(router, seed)
    if len(replicas) == 1:
        only = replicas[0]
        for t, rid, p, o in zip(times, rids, prompts, outputs, strict=True):
            if only.now < t:
                only.advance_to(t)
            only.submit(rid, p, o, kv_ready)
    elif not policy.needs_state:
        for t, rid, p, o in zip(times, rids, prompts, outputs, strict=True):
            chosen = replicas[policy.pick(replicas, rid, p)]
            if chosen.now < t:
                chosen.advance_to(t)
            chosen.submit(rid, p, o, kv_ready)
    else:
        for t, rid, p, o in zip(times, rids, prompts, outputs, strict=True):
            for r in replicas:
                if r.now < t:
                    r.advance_to(t)
            replicas[policy.pick(replicas, rid, p)].submit(rid, p, o, kv_ready)
    for r in replicas:
        r.drain()


def _result(workload: Workload, book: RequestBook, replicas: Sequence[Replica],
            slo: SLO | None) -> ServingResult:
    return build_result(
        workload.arrival_s, workload.input_tokens, workload.output_tokens,
        np.asarray(book.first_token, dtype=np.float64), np.asarray(book.finish, dtype=np.float64),
        np.asarray(book.truncated, dtype=bool), np.asarray(book.replica, dtype=np.int64),
        sum(r.preemptions for r in replicas), slo,
        [(r.busy_start, r.busy_end) for r in replicas],
    )


def _book(workload: Workload) -> RequestBook:
    return RequestBook(workload.arrival_s.tolist(), workload.input_tokens.tolist(),
                       workload.output_tokens.tolist())


def simulate_cluster(replicas: Sequence[ReplicaSpec], workload: Workload,
                     router: str = "least_outstanding", slo: SLO | None = None,
                     seed: int = 0) -> ServingResult:
    """Replicas (possibly heterogeneous) behind one router policy (see routers.ROUTERS)."""
    if not replicas:
        raise SpecError("simulate_cluster needs at least one replica")
    if any(r.role != "both" for r in replicas):
        raise SpecError("use simulate_disaggregated for prefill/decode roles")
    book = _book(workload)
    reps = _replicas(replicas, book)
    _dispatch(reps, book.arrival, range(len(workload)), book.input_tokens, book.output_tokens,
              router, seed)
    return _result(workload, book, reps, slo)


def simulate_replica(model: ModelSpec | str, gpu: GPUSpec | str, tp: int, workload: Workload,
                     *, pp: int = 1, config: EngineConfig | None = None,
                     slo: SLO | None = None, efficiency: Efficiency | None = None
                     ) -> ServingResult:
    """One replica of `model` on `pp` stages of `tp` x `gpu` serving `workload`."""
    dep = make_deployment(get_model(model), get_gpu(gpu), tp, pp)
    spec = ReplicaSpec(dep, config or EngineConfig(), efficiency)
    return simulate_cluster([spec], workload, slo=slo)


def simulate_disaggregated(prefill: Sequence[ReplicaSpec], decode: Sequence[ReplicaSpec],
                           workload: Workload, link: Link, *, kv_bits: int | None = None,
                           router: str = "least_outstanding", slo: SLO | None = None,
                           seed: int = 0) -> ServingResult:
    """Prefill replicas hand each request's KV cache to decode replicas over `link`
    (alpha-beta; `kv_bits=4` models ThunderServe's 4-bit KV transfer compression)."""
    if not prefill or not decode:
        raise SpecError("disaggregated serving needs >= 1 prefill and >= 1 decode replica")
    book = _book(workload)
    handoffs: list[tuple[float, int, int]] = []
    model = prefill[0].deployment.model

    def on_prefilled(rid: int, t: float, ctx: int) -> None:
        if book.output_tokens[rid] > 1:
            handoffs.append((t + kv_transfer_time(model, ctx, link, kv_bits), rid, ctx))

    pre = []
    for i, spec in enumerate(prefill):
        cost = cost_model_for(spec.deployment, spec.efficiency)
        pre.append(Replica(i, cost, spec.config, _kv_capacity(spec), book, "prefill",
                           on_prefilled))
    _dispatch(pre, book.arrival, range(len(workload)), book.input_tokens,
              [1] * len(workload), router, seed)
    for rid in range(len(workload)):  # prefill marks finish; decode overwrites it
        if book.output_tokens[rid] > 1:
            book.finish[rid] = math.nan
    handoffs.sort()
    dec = _replicas([ReplicaSpec(s.deployment, s.config, s.efficiency, "decode")
                     for s in decode], book, offset=len(prefill))
    _dispatch(dec, [h[0] for h in handoffs], [h[1] for h in handoffs],
              [h[2] for h in handoffs], [book.output_tokens[h[1]] for h in handoffs],
              router, seed, kv_ready=True)
    return _result(workload, book, pre + dec, slo)


def max_sustainable_rate(model: ModelSpec | str, gpu: GPUSpec | str, tp: int,
                         input_tokens: int, output_tokens: int, slo: SLO, *, pp: int = 1,
                         attainment: float = 0.9, config: EngineConfig | None = None,
                         n_requests: int = 400, iterations: int = 10, seed: int = 0) -> float:
    """Highest Poisson rate (req/s) at which `attainment` of requests meet `slo`, found by
    doubling then bisection over simulated runs of about `n_requests` requests. 0.0 if even
    an isolated request misses the SLO."""
    if slo.empty:
        raise SpecError("max_sustainable_rate needs at least one SLO deadline")

    def ok(rate: float) -> bool:
        wl = poisson(rate, n_requests / rate, input_tokens, output_tokens, seed)
        res = simulate_replica(model, gpu, tp, wl, pp=pp, config=config, slo=slo)
        return res.slo_attainment >= attainment

    single = simulate_replica(model, gpu, tp, replay([(0.0, input_tokens, output_tokens)]),
                              pp=pp, config=config, slo=slo)
    if not single.n_completed or single.slo_attainment < 1.0:
        return 0.0
    lo, hi = 0.0, 1.0 / max(single.mean_e2e_s, 1e-6)
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1e6:
            return hi
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
