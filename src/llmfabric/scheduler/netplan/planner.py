"""HeroServe's offline planner (Algorithm 1 with Algorithm 2 inside) -> `NetPlan`.

For each candidate P_all = (P^p_tens, P^p_pipe, P^d_tens, P^d_pipe) (`candidates`, at most
`max_candi`): keep the phase's GPUs with memory >= R / (P_tens P_pipe R_frac), form as many
instances as they hold, group them into TP groups of P_tens (`Strategy.group`: for
HeroServe every distinct result of constrained k-means on the latency matrix + perturbation,
`grouping.heroserve_groups`; the baselines have one), give every group its all-reduce
(`Strategy.comm`: INA at a switch with free aggregator slots, or ring), chain each instance's
groups into pipeline stages (layers split by memory bandwidth x TP), and price every pair of
the phases' candidate groupings (`evaluate`; the P_all keeps the best pair by `_better`, so
among groupings eq. 5 ranks alike the one whose KV or all-reduce loads a shared link less):

- T_pre = the simulator's prefill time of one K_in prompt on the planned deployment (TP
  all-reduces by the group's model, PP boundaries by their routes); T_c^pre the same with free
  communication, T_n^pre the difference. T_dec = decode step at the load's batch + T_f
  (eq. 4 as printed) + T_f's wait at min(rate, H) (`NetPlan.T_f_wait`), T_f =
  `commcost.t_kv` (eqs. 14-15, the hand-off alone).
- H (eq. 1, as a rate): the largest total arrival rate lambda, spread evenly over instances,
  with rho < 1, M/D/1 T_queue + T_pre <= SLA_pre per prefill instance, and a decode batch
  b = lambda_d K_out step(b) (Little) that fits the KV memory with step(b) + T_f + W_kv(lambda)
  <= SLA_dec (W_kv: the hand-off's wait behind other requests' on its bottleneck link,
  linkload.KvQueue); bisection. Then the links: H <= min over directed edges of
  link_util x C_e / w_e, w_e the bytes one request puts on e (linkload.py). `NetPlan.binding`
  names the bound that caps H: prefill | ttft | kv-cap | tpot | link:<a>-><b>.

The best candidate by H (ties: fewer GPUs, then lower T_pre + T_dec, then order) is the
plan. Everything is seeded: the same problem gives the same plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmfabric.scheduler.netplan.chaining import chain_by_links
from llmfabric.scheduler.netplan.commcost import (
    StageGPUs,
    choose_scheme,
    group_allreduce,
    t_kv,
)
from llmfabric.scheduler.netplan.grouping import heroserve_groups
from llmfabric.scheduler.netplan.linkload import (
    KvQueue,
    LinkBound,
    LinkLoad,
    ina_load,
    kv_load,
    link_rate,
    mean_load,
    pp_load,
    pp_sender,
    ring_load,
    total,
    utilisation,
)
from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.problem import NetProblem
from llmfabric.sim.collectives import AllReduceModel, AllReduceRegime
from llmfabric.sim.costs import StepCostModel, cost_model_for
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.memory import memory_plan, weight_bytes
from llmfabric.sim.operators import tp_allreduce_bytes_per_token
from llmfabric.sim.parallel import Deployment, Link, Stage, balanced_layer_split
from llmfabric.sim.topology import NodeId

TP_CHOICES = (1, 2, 4, 8, 16)
MAX_PP = 8
FREE_AR = AllReduceModel(AllReduceRegime(0.0, 0.0, 1e30))
FREE_LINK = Link(1e30, 0.0)


@dataclass(frozen=True, slots=True)
class GroupComm:
    """A TP group's all-reduce: scheme, switch, model, and the costs that decided it."""

    scheme: str  # "ina" | "ring" (baselines may add a fallback share to "ina")
    switch: NodeId | None
    model: AllReduceModel
    t_ina: float
    t_ring: float
    load: LinkLoad  # bytes on each directed edge per byte all-reduced by each member
    fallback: float = 0.0  # DS-ATP: share of chunks on the parameter-server path


# (problem, GPUs, P_tens, #groups, message bytes, routes) -> (candidate groupings, best
# first by the strategy's own measure; the most perturbation sweeps one of them took)
GroupFn = Callable[[NetProblem, Sequence[NodeId], int, int, float, Routes],
                   tuple[list[list[list[NodeId]]], int]]
CommFn = Callable[[NetProblem, Sequence[NodeId], float, dict[NodeId, int], Routes], GroupComm]
# (problem, groups in topology order, P_pp, activation bytes, routes) -> groups reordered so
# that each run of P_pp groups is one instance (None: topology order).
ChainFn = Callable[[NetProblem, Sequence[list[NodeId]], int, float, Routes], list[list[NodeId]]]


@dataclass(frozen=True)
class Strategy:
    """How a system groups GPUs and synchronises a group; `kv_kinds`: edge kinds KV may use.
    `plans_kv`: whether its planner prices the KV hand-off when it picks a layout. DistServe's
    does not: its placement assumes servers joined by networks "assumed to provide stable
    high-throughput transmission with negligible latency" (HeroServe §I on DistServe [4] and
    Splitwise [7]), so it and the baselines built on its placement choose with the hand-off
    free (time, wait and link share) and are then priced, like every system, in full."""

    name: str
    group: GroupFn
    comm: CommFn
    kv_kinds: frozenset[str] | None = None
    chain: ChainFn | None = None
    plans_kv: bool = True


def key(group: Sequence[NodeId]) -> str:
    return ",".join(str(g) for g in group)


# --- candidate enumeration ----------------------------------------------------------------
def used_gpus(n_gpus: int, tp: int, pp: int) -> int:
    """GPUs a (tp, pp) layout occupies when replicated over n_gpus (whole instances)."""
    return n_gpus // (tp * pp) * tp * pp


def _phase_candidates(problem: NetProblem, gpus: Sequence[NodeId]) -> list[tuple[int, int]]:
    model = problem.model
    mem = max(get_gpu(problem.topology.gpu(g).gpu_type).mem_bytes for g in gpus)
    n_min = math.ceil(weight_bytes(model) / (mem * problem.r_frac))
    out = []
    for tp in TP_CHOICES:
        if model.n_heads % tp or (model.n_kv_heads % tp and tp % model.n_kv_heads):
            continue
        for pp in range(1, min(MAX_PP, model.n_layers) + 1):
            if n_min <= tp * pp <= len(gpus):
                out.append((tp, pp))
    return out


def candidates(problem: NetProblem) -> list[tuple[int, int, int, int]]:
    """P_all candidates: per phase P_tens in {1, 2, 4, 8, 16} dividing the heads, P_tens x
    P_pipe >= N_min; pairs ordered by the GPUs their replicated instances occupy (most
    first: H is the rate the GPU sets sustain), then pipeline depth, then TP (shallowest,
    narrowest first); the first max_candi."""
    pre = _phase_candidates(problem, problem.prefill_gpus)
    dec = _phase_candidates(problem, problem.decode_gpus)
    n_p, n_d = len(problem.prefill_gpus), len(problem.decode_gpus)
    pairs = [(a, b, c, d) for a, b in pre for c, d in dec]
    pairs.sort(key=lambda p: (-(used_gpus(n_p, p[0], p[1]) + used_gpus(n_d, p[2], p[3])),
                              p[1] + p[3], p[0] + p[2], p))
    return pairs[:problem.max_candi]


# --- one phase -----------------------------------------------------------------------------
@dataclass
class PhasePlan:
    instances: list[list[StageGPUs]]
    comms: dict[str, GroupComm]
    deployments: list[Deployment]
    sweeps: int  # most perturbation sweeps one grouping took (over phases, candidates)
    token_loads: list[LinkLoad]  # per instance: bytes per edge per token it processes


def _gpu_spec(problem: NetProblem, group: Sequence[NodeId]) -> GPUSpec:
    specs = [get_gpu(problem.topology.gpu(g).gpu_type) for g in group]
    return min(specs, key=lambda s: (s.mem_bw, s.mem_bytes))


def _boundary_link(problem: NetProblem, routes: Routes, src: Sequence[NodeId],
                   dst: Sequence[NodeId], nbytes: float) -> tuple[Link, LinkLoad]:
    """Eq. 6's route (best sender, slowest receiver) folded into a Link, and the bytes per
    edge per activation byte (the sender sends to every receiver)."""
    sender, worst = pp_sender(routes, src, dst, nbytes, problem.hop_latency)
    inv = worst.inverse_bw_sum
    link = Link(1.0 / inv if inv > 0 else 1e30, worst.latency(problem.hop_latency))
    return link, pp_load(routes, sender, dst)


def build_phase(problem: NetProblem, strategy: Strategy, gpus: Sequence[NodeId], tp: int,
                pp: int, nbytes: float, routes: Routes) -> list[PhasePlan] | None:
    """Group, synchronise and chain one phase's instances, once per candidate grouping the
    strategy offers (its order kept); None when too few GPUs fit."""
    model = problem.model
    need = weight_bytes(model) / (tp * pp * problem.r_frac)
    fit = [g for g in gpus if get_gpu(problem.topology.gpu(g).gpu_type).mem_bytes >= need]
    n_inst = len(fit) // (tp * pp)
    if n_inst < 1:
        return None
    groupings, sweeps = strategy.group(problem, fit, tp, n_inst * pp, nbytes, routes)
    return [_build_instances(problem, strategy, list(groups), tp, pp, n_inst, nbytes, routes,
                             sweeps) for groups in groupings]


def _build_instances(problem: NetProblem, strategy: Strategy, groups: list[list[NodeId]],
                     tp: int, pp: int, n_inst: int, nbytes: float, routes: Routes,
                     sweeps: int) -> PhasePlan:
    model = problem.model
    index = {g: k for k, g in enumerate(problem.topology.gpus())}
    groups.sort(key=lambda grp: min(index[g] for g in grp))
    if strategy.chain is not None:
        groups = strategy.chain(problem, groups, pp, nbytes, routes)
    free = {s: problem.topology.switch(s).aggregator_slots // problem.m_ina
            for s in problem.topology.switches()}
    comms: dict[str, GroupComm] = {}
    instances: list[list[StageGPUs]] = []
    deps: list[Deployment] = []
    token_loads: list[LinkLoad] = []
    ar_bytes = tp_allreduce_bytes_per_token(model) / 2  # one all-reduce, per token
    act_bytes = model.hidden * model.act_bits / 8  # one activation, per token
    for i in range(n_inst):
        chain = groups[i * pp:(i + 1) * pp]
        specs = [_gpu_spec(problem, grp) for grp in chain]
        layers = balanced_layer_split(model.n_layers, [s.mem_bw * tp for s in specs])
        stages, ars, placed = [], [], []
        tokens = LinkLoad()
        start = 0
        for grp, spec, n in zip(chain, specs, layers, strict=True):
            comm = strategy.comm(problem, grp, nbytes, free, routes)
            if comm.switch is not None:  # the group holds an aggregator slot there
                free[comm.switch] -= 1
            comms[key(grp)] = comm
            tokens.add(comm.load, 2 * n * ar_bytes)  # two all-reduces a layer (sim.costs)
            ars.append(comm.model)
            stages.append(Stage(spec, tp, n))
            placed.append(StageGPUs(tuple(grp), (start, start + n)))
            start += n
        instances.append(placed)
        act = nbytes  # one activation message: the all-reduce message's size
        bounds = [_boundary_link(problem, routes, chain[k], chain[k + 1], act)
                  for k in range(pp - 1)]
        for _, load in bounds:
            tokens.add(load, act_bytes)
        token_loads.append(tokens)
        deps.append(Deployment(model, tuple(stages), pp_links=tuple(lk for lk, _ in bounds),
                               stage_allreduces=tuple(ars)))
    return PhasePlan(instances, comms, deps, sweeps, token_loads)


# --- pricing -------------------------------------------------------------------------------
def _compute_only(dep: Deployment) -> Deployment:
    return Deployment(dep.model, dep.stages, pp_links=(FREE_LINK,) * (dep.pp - 1),
                      stage_allreduces=(FREE_AR,) * dep.pp)


@dataclass(frozen=True, slots=True)
class Pricing:
    t_pre: float
    t_c_pre: float
    t_f: float
    step: Callable[[float], float]
    step_c: Callable[[float], float]
    max_batch: float
    link: LinkBound  # the rate the links carry (linkload.py)
    kv_wait: Callable[[float], float]  # the KV hand-off's queueing at total rate lam


def _decode_batch(rate: float, k_out: float, step: Callable[[float], float],
                  max_batch: float) -> float | None:
    """Little's law fixed point b = rate x K_out x step(b) (None: the batch diverges)."""
    b = 1.0
    for _ in range(200):
        nb = max(1.0, rate * k_out * step(b))
        if nb > max_batch:
            return None
        if abs(nb - b) < 1e-6:
            return nb
        b = nb
    return b


def _fails(pr: Pricing, problem: NetProblem, n_pre: int, n_dec: int, lam: float) -> str:
    """The first bound total rate `lam` breaks ("" when it meets them all): "prefill"
    (rho >= 1), "ttft", "kv-cap" (the decode batch outgrows the KV memory) or "tpot" (step
    + T_f + the KV hand-off's wait on a shared link)."""
    wl = problem.workload
    lp, ld = lam / n_pre, lam / n_dec
    rho = lp * pr.t_pre
    if rho >= 1:
        return "prefill"
    if lp * pr.t_pre ** 2 / (2 * (1 - rho)) + pr.t_pre > problem.sla_pre:
        return "ttft"
    b = _decode_batch(ld, wl.mean_out, pr.step, pr.max_batch)
    if b is None:
        return "kv-cap"
    if pr.step(b) + problem.kv_in_tpot(pr.t_f + pr.kv_wait(lam)) > problem.sla_dec:
        return "tpot"
    return ""


def scalability(pr: Pricing, problem: NetProblem, n_pre: int, n_dec: int
                ) -> tuple[float, str]:
    """(H, what binds): the largest total rate meeting both SLAs (bisection) and carried by
    every link (`pr.link`, "link:<a>-><b>" when it binds); (0, the bound a trickle breaks)
    when none does."""
    first = _fails(pr, problem, n_pre, n_dec, 1e-9)
    if first:
        return 0.0, first
    lo, hi = 1e-9, n_pre / pr.t_pre
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _fails(pr, problem, n_pre, n_dec, mid) else (mid, hi)
    if pr.link.rate < lo:
        return pr.link.rate, pr.link.name
    return lo, _fails(pr, problem, n_pre, n_dec, hi) or "prefill"


def _step_fn(cm: StepCostModel, ctx: float) -> Callable[[float], float]:
    def step(b: float) -> float:
        n = max(1, math.ceil(b))
        return cm.decode_step_time(n, n * ctx)
    return step


# --- the plan ------------------------------------------------------------------------------
@dataclass
class NetPlan:
    system: str
    p_all: tuple[int, int, int, int]
    prefill_groups: list[list[list[NodeId]]]  # instance -> stage -> TP group
    decode_groups: list[list[list[NodeId]]]
    layers_pre: list[list[tuple[int, int]]]
    layers_dec: list[list[tuple[int, int]]]
    schemes: dict[str, str]
    ina_switch: dict[str, NodeId | None]
    paths: dict[str, list[NodeId]]
    T_pre: float
    T_c_pre: float
    T_dec: float
    T_c_dec: float
    T_f: float
    H: float
    per_gpu_rate: float
    n_gpus: int
    candidates_tried: int
    sweeps: int  # most perturbation sweeps one grouping took (over phases, candidates)
    planner_s: float
    groupings_priced: int = 1  # (prefill, decode) grouping pairs priced for this P_all
    binding: str = ""  # what caps H: prefill | ttft | kv-cap | tpot | link:<a>-><b>
    T_f_wait: float = 0.0  # the KV hand-off's queueing on a shared link at min(rate, H)
    T_f_wait_h: float = 0.0  # ... and at H
    link_util_h: float = 0.0  # the most loaded link's utilisation at H ...
    link_edge_h: str = ""  # ... and that link, "<a>-><b>"
    problem: NetProblem | None = field(default=None, repr=False)
    _pre: PhasePlan | None = field(default=None, repr=False)
    _dec: PhasePlan | None = field(default=None, repr=False)
    _kv_routes: Routes | None = field(default=None, repr=False)
    # The same layout as the strategy's planner priced it when it chose (`Strategy.plans_kv`
    # False: the KV hand-off free); None: as priced here.
    planned_as: NetPlan | None = field(default=None, repr=False)

    @property
    def planned_H(self) -> float:
        """H as the strategy's planner saw it when it chose this layout."""
        return self.H if self.planned_as is None else self.planned_as.H

    @property
    def T_n_pre(self) -> float:
        return self.T_pre - self.T_c_pre

    @property
    def T_n_dec(self) -> float:
        kv = self.T_f + self.T_f_wait
        return self.T_dec - self.T_c_dec - (self.problem.kv_in_tpot(kv) if self.problem
                                            else kv)

    def deployments(self) -> tuple[list[Deployment], list[Deployment]]:
        if self._pre is None or self._dec is None:
            raise SpecError("this plan carries no deployments (load it with its problem)")
        return self._pre.deployments, self._dec.deployments

    def to_deployments(self) -> tuple[Deployment, Deployment]:
        """The first prefill and decode instance, with per-stage all-reduce models and PP
        links (`kv_stage_link` prices their KV hand-off)."""
        pre, dec = self.deployments()
        return pre[0], dec[0]

    def kv_stage_link(self, i: int, j: int, sp: int, sd: int) -> Link:
        """Prefill instance i stage sp -> decode instance j stage sd as one Link
        (for `simulate_disaggregated(stage_link=...)`): latency = the slowest sender's, rate =
        the stage pair's bytes over the slowest sender's serialized per-byte time."""
        if self._pre is None or self._dec is None or self.problem is None:
            raise SpecError("this plan carries no deployments (load it with its problem)")
        ps, ds = self._pre.instances[i][sp], self._dec.instances[j][sd]
        if self._kv_routes is None:
            self._kv_routes = Routes(self.problem.topology, 1 << 20)
        return stage_pair_link(self.problem, ps, ds, self._kv_routes)

    def to_json(self) -> dict[str, Any]:
        skip = {"problem", "_pre", "_dec", "_kv_routes", "planned_as"}
        doc = {k: v for k, v in self.__dict__.items() if k not in skip}
        doc.update(T_n_pre=self.T_n_pre, T_n_dec=self.T_n_dec, planned_H=self.planned_H)
        return doc


def stage_pair_link(problem: NetProblem, ps: StageGPUs, ds: StageGPUs, routes: Routes) -> Link:
    from llmfabric.scheduler.netplan.commcost import kv_sends

    one = kv_sends(problem.model, [ps], [ds], 1.0)
    total = sum(b for sends in one.values() for _, b in sends)
    slope = lat = 0.0
    for k, sends in one.items():
        slope = max(slope, sum(b * routes.route(k, z).inverse_bw_sum for z, b in sends))
        lat = max(lat, sum(routes.route(k, z).latency(problem.hop_latency) for z, _ in sends))
    return Link(total / slope if slope > 0 and total > 0 else 1e30, lat)


def evaluate(problem: NetProblem, strategy: Strategy, p_all: tuple[int, int, int, int],
             routes: Routes, kv_routes: Routes) -> NetPlan | None:
    """The plan for one P_all: every pair of the phases' candidate groupings priced with the
    whole model (H with the link bound and the KV hand-off's wait), the best by `_better`
    (ties: the strategy's order, i.e. Alg. 2's cheapest grouping). A strategy that does not
    plan the KV hand-off (`Strategy.plans_kv`) chooses by the pricing without it; the plan
    returned is its choice priced in full (`planned_as`: how it chose)."""
    tp_p, pp_p, tp_d, pp_d = p_all
    model, wl = problem.model, problem.workload
    k_in = max(1, round(wl.mean_in))
    pres = build_phase(problem, strategy, problem.prefill_gpus, tp_p, pp_p,
                       k_in * model.hidden * 2.0, routes)
    decs = build_phase(problem, strategy, problem.decode_gpus, tp_d, pp_d,
                       problem.nominal_decode_batch * model.hidden * 2.0, routes)
    if not pres or not decs:
        return None
    ctx = wl.mean_in + wl.mean_out / 2
    pre_costs = [(max(cost_model_for(d).prefill_time([k_in]) for d in pre.deployments),
                  cost_model_for(_compute_only(pre.deployments[0])).prefill_time([k_in]))
                 for pre in pres]
    dec_steps = [([_step_fn(cost_model_for(d), ctx) for d in dec.deployments],
                  [_step_fn(cost_model_for(_compute_only(d)), ctx) for d in dec.deployments])
                 for dec in decs]
    best: NetPlan | None = None
    chosen: tuple[Any, ...] = ()
    for pre, (t_pre, t_c_pre) in zip(pres, pre_costs, strict=True):
        for dec, (steps, steps_c) in zip(decs, dec_steps, strict=True):
            args = (problem, strategy, p_all, pre, dec, t_pre, t_c_pre, steps, steps_c,
                    kv_routes)
            one = _price(*args, kv_free=not strategy.plans_kv)
            if best is None or _better(one, best):
                best, chosen = one, args
    assert best is not None
    if not strategy.plans_kv:
        best = replace(_price(*chosen), planned_as=best)
    best.groupings_priced = len(pres) * len(decs)
    return best


def _price(problem: NetProblem, strategy: Strategy, p_all: tuple[int, int, int, int],
           pre: PhasePlan, dec: PhasePlan, t_pre: float, t_c_pre: float,
           steps: list[Callable[[float], float]], steps_c: list[Callable[[float], float]],
           kv_routes: Routes, kv_free: bool = False) -> NetPlan:
    """The plan of one grouping pair; `kv_free`: as a planner that assumes a network of
    negligible latency sees it (no hand-off time, wait or link share)."""
    tp_p, pp_p, tp_d, pp_d = p_all
    model, wl = problem.model, problem.workload
    t_f = 0.0 if kv_free else max(
        t_kv(problem.topology, model, pi, dj, wl.mean_in, routes=kv_routes,
             hop_latency=problem.hop_latency)
        for pi in pre.instances[:4] for dj in dec.instances[:4])
    cap = min(memory_plan(d).kv_capacity_tokens for d in dec.deployments)
    kv = kv_load(model, pre.instances, dec.instances, wl.mean_in, kv_routes)
    per_request = total([(mean_load(pre.token_loads), wl.mean_in),
                         (mean_load(dec.token_loads), wl.mean_out),
                         (kv.mean, 0.0 if kv_free else 1.0)])
    kv_wait = (lambda lam: 0.0) if kv_free else KvQueue(per_request, kv).wait
    pr = Pricing(t_pre, t_c_pre, t_f, lambda b: max(s(b) for s in steps),
                 lambda b: max(s(b) for s in steps_c), cap / (wl.mean_in + wl.mean_out),
                 link_rate(per_request, problem.link_util), kv_wait)
    n_pre, n_dec = len(pre.instances), len(dec.instances)
    h, binding = scalability(pr, problem, n_pre, n_dec)
    served = min(wl.rate, h)
    b = _decode_batch(served / n_dec if h > 0 else 0.0, wl.mean_out, pr.step,
                      pr.max_batch) or 1.0
    wait = kv_wait(served) if h > 0 else 0.0
    util_h, edge_h = utilisation(per_request, h)
    n_gpus = n_pre * tp_p * pp_p + n_dec * tp_d * pp_d
    comms = {**pre.comms, **dec.comms}
    paths = {}
    for k, sends in list(_first_kv_sends(problem, pre, dec).items())[:64]:
        for z in sends:
            paths[f"{k}->{z}"] = list(kv_routes.route(k, z).nodes)
    plan = NetPlan(
        strategy.name, p_all,
        [[list(s.gpus) for s in inst] for inst in pre.instances],
        [[list(s.gpus) for s in inst] for inst in dec.instances],
        [[s.layers for s in inst] for inst in pre.instances],
        [[s.layers for s in inst] for inst in dec.instances],
        {k: c.scheme for k, c in comms.items()},
        {k: c.switch for k, c in comms.items()}, paths,
        t_pre, t_c_pre, pr.step(b) + problem.kv_in_tpot(t_f + wait), pr.step_c(b), t_f, h,
        h / n_gpus, n_gpus,
        0, max(pre.sweeps, dec.sweeps), 0.0, binding=binding, T_f_wait=wait,
        T_f_wait_h=kv_wait(h) if h > 0 else 0.0,
        link_util_h=util_h, link_edge_h="" if edge_h is None else f"{edge_h[0]}->{edge_h[1]}",
        problem=problem, _pre=pre, _dec=dec, _kv_routes=kv_routes)
    return plan


def _first_kv_sends(problem: NetProblem, pre: PhasePlan, dec: PhasePlan
                    ) -> dict[NodeId, list[NodeId]]:
    from llmfabric.scheduler.netplan.commcost import kv_sends

    sends = kv_sends(problem.model, pre.instances[0], dec.instances[0], 1.0)
    return {k: [z for z, _ in v] for k, v in sends.items()}


H_TIE = 1e-3  # H within 0.1 % ties: below what the analytic model resolves


def _better(a: NetPlan, b: NetPlan) -> bool:
    """Larger H; at equal H (within H_TIE) fewer GPUs, then lower latency T_pre + T_dec (the
    paper's second goal, "minimizing the average token generation latency", §III-A: when
    decode memory or a shared link binds H, layouts tie on H but not on TTFT; a link-bound
    H differs between layouts only by the order of their KV sends, ~0.05 %); then earlier."""
    if a.H > b.H * (1 + H_TIE):
        return True
    if a.H < b.H * (1 - H_TIE):
        return False
    if a.n_gpus != b.n_gpus:
        return a.n_gpus < b.n_gpus
    return a.T_pre + a.T_dec < (b.T_pre + b.T_dec) * (1 - 1e-9)


def plan_with(problem: NetProblem, strategy: Strategy) -> NetPlan:
    """Algorithm 1 under `strategy`: the candidate with the largest H."""
    t0 = time.perf_counter()
    routes = Routes(problem.topology, 1 << 20)
    kv_routes = Routes(problem.topology, 1 << 20, strategy.kv_kinds)
    best: NetPlan | None = None
    cands = candidates(problem)
    sweeps = 0
    for p_all in cands:
        plan = evaluate(problem, strategy, p_all, routes, kv_routes)
        if plan is None:
            continue
        sweeps = max(sweeps, plan.sweeps)
        if best is None or _better(plan.planned_as or plan, best.planned_as or best):
            best = plan
    if best is None:
        raise SpecError("no (TP, PP) candidate fits the model on the given GPUs")
    best.candidates_tried = len(cands)
    best.sweeps = sweeps
    best.planner_s = time.perf_counter() - t0
    return best


# --- HeroServe's strategy ------------------------------------------------------------------
def hybrid_model(ina: AllReduceModel, ring: AllReduceModel, n: int) -> AllReduceModel | None:
    """min(INA, ring) per message as one model: INA (the `custom` regime) below the bytes
    where the two affine costs cross, ring above; None when n is not a size the custom
    slot serves or INA never wins."""
    from llmfabric.sim.collectives import CUSTOM_WORLD_SIZES

    if n not in CUSTOM_WORLD_SIZES:
        return None
    a0, a1 = ina.time(0.0, n), ina.time(1e6, n) - ina.time(0.0, n)
    r0, r1 = ring.time(0.0, n), ring.time(1e6, n) - ring.time(0.0, n)
    if a0 >= r0:
        return None
    cross = math.inf if a1 <= r1 else (r0 - a0) / (a1 - r1) * 1e6
    return AllReduceModel(ring.nccl, ina.nccl, cross)


def heroserve_comm(problem: NetProblem, group: Sequence[NodeId], nbytes: float,
                   free: dict[NodeId, int], routes: Routes) -> GroupComm:
    """Algorithm 2's choice at the phase's message size; the model the simulator runs picks
    INA or ring per message (the online scheduler re-picks the scheme per all-reduce,
    §III-D), so a group with a switch slot holds it whenever INA wins small messages."""
    topo, hop, net = problem.topology, problem.hop_latency, problem.net_collective_s
    c = choose_scheme(topo, group, nbytes, free_slots=free, hop_latency=hop, routes=routes,
                      net_s=net, spread=True)
    ring = group_allreduce(topo, group, "ring", None, hop_latency=hop, routes=routes,
                           net_s=net)
    ring_bytes = ring_load(topo, group, routes)
    if c.switch is None:
        return GroupComm("ring", None, ring, c.t_ina, c.t_ring, ring_bytes)
    ina = group_allreduce(topo, group, "ina", c.switch, hop_latency=hop, routes=routes,
                          net_s=net, spread=True)
    hybrid = hybrid_model(ina, ring, len(group))
    if c.scheme == "ina":
        return GroupComm("ina", c.switch, hybrid or ina, c.t_ina, c.t_ring,
                         ina_load(group, c.switch, routes, spread=True))
    if hybrid is not None:
        return GroupComm("ring", c.switch, hybrid, c.t_ina, c.t_ring, ring_bytes)
    return GroupComm("ring", None, ring, c.t_ina, c.t_ring, ring_bytes)


HEROSERVE = Strategy("heroserve", heroserve_groups, heroserve_comm, chain=chain_by_links)


def plan(problem: NetProblem) -> NetPlan:
    """HeroServe's plan for `problem` (deterministic for its seed)."""
    return plan_with(problem, HEROSERVE)
