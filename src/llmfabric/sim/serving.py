"""Serving simulations: one replica, many replicas behind a router, prefill/decode split,
and the maximum sustainable rate under an SLO.

These are the entry points for the scheduler (`simulate_replica`, `simulate_cluster`,
`max_sustainable_rate`). Everything is deterministic for a given workload and seed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmfabric.sim.calibration import Efficiency
from llmfabric.sim.costs import cost_model_for
from llmfabric.sim.engine import EngineConfig, Replica, RequestBook, Role
from llmfabric.sim.errors import InfeasibleError, SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.memory import memory_plan
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import (
    Deployment,
    Link,
    kv_transfer_time,
    kv_transfer_time_staged,
    make_deployment,
)
from llmfabric.sim.pdrouting import KVLinks, PDRouting
from llmfabric.sim.results import SLO, ServingResult, build_result
from llmfabric.sim.routers import PowerOfTwo, make_router
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


def _router_options(workload: Workload,
                    options: Mapping[str, object] | None) -> dict[str, object]:
    opts: dict[str, object] = dict(options or {})
    if workload.prefix_id is not None:
        opts.setdefault("prefixes", workload.prefix_id.tolist())
    return opts


def _dispatch(replicas: list[Replica], times: Sequence[float], rids: Sequence[int],
              prompts: Sequence[int], outputs: Sequence[int], router: str, seed: int,
              kv_ready: bool = False, options: Mapping[str, object] | None = None) -> None:
    policy = make_router(router, seed, **(options or {}))
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
    elif isinstance(policy, PowerOfTwo):  # only the two probed replicas must be current
        n = len(replicas)
        for t, rid, p, o in zip(times, rids, prompts, outputs, strict=True):
            for i in policy.probe(n):
                if replicas[i].now < t:
                    replicas[i].advance_to(t)
            replicas[policy.pick(replicas, rid, p)].submit(rid, p, o, kv_ready)
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
                     seed: int = 0, router_options: Mapping[str, object] | None = None
                     ) -> ServingResult:
    """Replicas (possibly heterogeneous) behind one router policy (see routers.ROUTERS;
    `router_options`, e.g. {"eps": 0.1}, go to it; prefix routers read
    `workload.prefix_id`)."""
    if not replicas:
        raise SpecError("simulate_cluster needs at least one replica")
    if any(r.role != "both" for r in replicas):
        raise SpecError("use simulate_disaggregated for prefill/decode roles")
    book = _book(workload)
    reps = _replicas(replicas, book)
    if len(workload):
        _require_kv(reps, int((workload.input_tokens + workload.output_tokens).min()),
                    "request (prompt + output)")
    _dispatch(reps, book.arrival, range(len(workload)), book.input_tokens, book.output_tokens,
              router, seed, options=_router_options(workload, router_options))
    return _result(workload, book, reps, slo)


def simulate_replica(model: ModelSpec | str, gpu: GPUSpec | str, tp: int, workload: Workload,
                     *, pp: int = 1, config: EngineConfig | None = None,
                     slo: SLO | None = None, efficiency: Efficiency | None = None
                     ) -> ServingResult:
    """One replica of `model` on `pp` stages of `tp` x `gpu` serving `workload`."""
    dep = make_deployment(get_model(model), get_gpu(gpu), tp, pp)
    spec = ReplicaSpec(dep, config or EngineConfig(), efficiency)
    return simulate_cluster([spec], workload, slo=slo)


def _require_kv(replicas: Sequence[Replica], need_tokens: int, what: str) -> None:
    """Raise when a replica's KV cannot hold even the smallest request: it would complete
    nothing (every request truncated), which is a layout error, not a result."""
    for r in replicas:
        if r.capacity < need_tokens + r.config.block_size / 2.0:
            dep = r.cost.deployment
            raise InfeasibleError(
                f"replica {r.index} ({dep.model.name} on "
                f"{[(s.gpu.name, s.tp, s.n_layers) for s in dep.stages]}) holds "
                f"{int(r.capacity)} KV tokens, less than the smallest {what} "
                f"({need_tokens} tokens): it would complete nothing. Add GPUs or memory, "
                "split layers by memory (sim.layersplit), or quantize the KV cache")


def simulate_disaggregated(prefill: Sequence[ReplicaSpec], decode: Sequence[ReplicaSpec],
                           workload: Workload, link: Link | LinkMatrix, *,
                           routing: PDRouting | None = None, kv_bits: int | None = None,
                           kv_group: int | None = None, link_contention: bool = False,
                           stage_link: Callable[[int, int, int, int], Link] | None = None,
                           router: str = "least_outstanding", slo: SLO | None = None,
                           seed: int = 0, router_options: Mapping[str, object] | None = None
                           ) -> ServingResult:
    """Prefill replicas hand each request's KV cache to decode replicas over `link`: one
    alpha-beta Link for every pair, or a LinkMatrix with one per (prefill, decode) pair.

    `routing`: fixed fractions (PDRouting: prefill by x, decode by y[prefill]; smooth weighted
    round robin); None: `router` picks the prefill replica on arrival and the decode replica
    (by its state) when the KV is ready (per-pair links) or arrives (one link).
    `kv_bits`/`kv_group`: KV re-quantized for the transfer (4-bit, group 64 = 4.5 bits per
    element incl. scale and minimum). `link_contention=True`: transfers on the same link
    (pair) queue first come first served; default off (ThunderServe eq. 1).
    `stage_link(i, j, stage_p, stage_d)`: per pipeline-stage links, the transfer then takes
    `kv_transfer_time_staged` (stage pairs holding the same layers in parallel)."""
    if not prefill or not decode:
        raise SpecError("disaggregated serving needs >= 1 prefill and >= 1 decode replica")
    if routing is not None and routing.shape != (len(prefill), len(decode)):
        raise SpecError(f"PDRouting is {routing.shape} but there are {len(prefill)} prefill "
                        f"and {len(decode)} decode replicas")
    links = KVLinks(link, len(prefill), len(decode), link_contention)
    book = _book(workload)
    ready: list[tuple[float, int, int]] = []
    model = prefill[0].deployment.model

    def on_prefilled(rid: int, t: float, ctx: int) -> None:
        if book.output_tokens[rid] > 1:
            ready.append((t, rid, ctx))

    pre = []
    for i, spec in enumerate(prefill):
        cost = cost_model_for(spec.deployment, spec.efficiency)
        pre.append(Replica(i, cost, spec.config, _kv_capacity(spec), book, "prefill",
                           on_prefilled))
    dec = _replicas([ReplicaSpec(s.deployment, s.config, s.efficiency, "decode")
                     for s in decode], book, offset=len(prefill))
    if len(workload):
        _require_kv(pre, int(workload.input_tokens.min()) + 1, "prompt")
        _require_kv(dec, int((workload.input_tokens + workload.output_tokens).min()),
                    "request (prompt + output)")
    picks = routing.start(seed) if routing is not None else None
    opts = _router_options(workload, router_options)
    if picks is not None:
        for t, rid, p in zip(book.arrival, range(len(workload)), book.input_tokens,
                             strict=True):
            chosen = pre[picks.prefill()]
            if chosen.now < t:
                chosen.advance_to(t)
            chosen.submit(rid, p, 1)
        for r in pre:
            r.drain()
    else:
        _dispatch(pre, book.arrival, range(len(workload)), book.input_tokens,
                  [1] * len(workload), router, seed, options=opts)
    for rid in range(len(workload)):  # prefill marks finish; decode overwrites it
        if book.output_tokens[rid] > 1:
            book.finish[rid] = math.nan
    policy = make_router(router, seed, **opts)

    def pick_decode(i: int, rid: int, ctx: int, t: float) -> int:
        if picks is not None:
            return picks.decode(i)
        if policy.needs_state:
            for r in dec:
                if r.now < t:
                    r.advance_to(t)
        return policy.pick(dec, rid, ctx)

    def transfer(i: int, j: int | None, ctx: int) -> float:
        if stage_link is not None and j is not None:
            return kv_transfer_time_staged(
                prefill[i].deployment, decode[j].deployment, ctx,
                lambda sp, sd: stage_link(i, j, sp, sd), kv_bits, kv_group)
        return kv_transfer_time(model, ctx, links.of(i, j), kv_bits, kv_group)

    # events: (time, rid, kind 0 = KV ready at prefill i / 1 = KV arrived at decode j, i, j,
    # cached tokens)
    pick_at_ready = links.per_pair or picks is not None or stage_link is not None
    events: list[tuple[float, int, int, int, int, int]] = [
        (t, rid, 0, book.replica[rid], -1, ctx) for t, rid, ctx in ready]
    heapq.heapify(events)
    while events:
        t, rid, kind, i, j, ctx = heapq.heappop(events)
        if kind == 0:
            jj = pick_decode(i, rid, ctx, t) if pick_at_ready else None
            duration = transfer(i, jj, ctx)
            begin = links.start(i, jj, t, duration)
            heapq.heappush(events, (begin + duration, rid, 1, i, -1 if jj is None else jj, ctx))
            continue
        if j < 0:
            j = pick_decode(i, rid, ctx, t)
        target = dec[j]
        if target.now < t:
            target.advance_to(t)
        target.submit(rid, ctx, book.output_tokens[rid], kv_ready=True)
    for r in dec:
        r.drain()
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
