"""Flying Serving in the simulator: DP engines that bind into TP groups and release online
(COMPANIONS §2.6), driven by the SAME policy objects as the engines (scheduler/switching.py).

`n_gpus / base_tp` engines are `Replica`s (TP = base_tp), each with its own KV. A `Bind` of an
aligned group of W engines pauses the members and creates a merged `Replica` of TP = W x
base_tp whose KV capacity is the members' FREE KV (`preempt_kv="keep"`: paused DP requests
keep their blocks) or their whole KV (`"recompute"`: the members' running requests are folded
back into their queues, prompt + generated tokens, and re-prefilled on resume). The merged cost
model is that of TP = W x base_tp, scaled by `dtp_allreduce_penalty[W]`. Paused members do not
advance. A `Release` folds the merged group's unfinished requests back onto its members
(re-prefill of prompt + generated tokens: the repository's behaviour) and resumes them.
Every switch costs `switch_latency_s` on the engines it touches. A bound group whose batch is
empty gives its engines back to the DP requests it paused (work-conserving resume: at once
once it has served a request, after GIVE_BACK_S if it never got one).

Methods: "hard" binds at once; "sequential" stops feeding the members and binds once the
requests they held when the bind was asked have finished; "soft" binds at the same moment but
keeps feeding the members meanwhile (new requests start in DP mode) and folds those requests
into the merged batch at the bind (prompt + generated tokens re-prefilled under TP).

Routing at each arrival: a request of priority >= `p_hi` (policy "priority" or a callable, when
a wider width is allowed) or one
too large for every single engine's KV waits at the driver for a bound group that holds it;
everything else goes to the least-outstanding target among free DP engines and bound groups
(a merged engine is a continuous batcher: normal requests join it). A priority request queues
ahead of the normal ones; one the policy has seen without forming a group (a saturated
cluster) runs in DP on the least loaded engine. With no wider width allowed, a request larger
than an engine's KV is rejected (static DP).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from llmfabric.sim.costs import StepCostModel, cost_model_for
from llmfabric.sim.engine import EngineConfig, Replica, RequestBook
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.memory import memory_plan
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import make_deployment
from llmfabric.sim.results import SLO, ServingResult, build_result, nan_stat
from llmfabric.sim.switching import (
    Bind,
    Method,
    Pending,
    Release,
    SwitchPolicy,
    SwitchState,
    aligned_groups,
    ewma_rate,
    make_policy,
)
from llmfabric.sim.workload import Workload

PreemptKV = Literal["keep", "recompute"]
# a bound group that never got a request gives its engines back to the DP work it paused
# after this long (so a policy that binds on an idle moment cannot starve paused requests)
GIVE_BACK_S = 1.0
MAX_DRAIN_TICKS = 200_000  # after the last arrival: stop (and reject what is left)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ModeChange:
    t: float
    width: int  # widest bound group after the change (1: all DP)
    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True, eq=False)
class FlyingResult:
    """ServingResult plus the mode timeline (Fig. 8) and per-class latencies."""

    serving: ServingResult
    timeline: tuple[ModeChange, ...]
    priority: npt.NDArray[np.int64]
    samples_t: FloatArray = field(default_factory=lambda: np.zeros(0))  # control ticks
    samples_width: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    samples_queue: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    samples_rate: FloatArray = field(default_factory=lambda: np.zeros(0))

    @property
    def switches(self) -> int:
        return len(self.timeline)

    def class_stats(self, p_hi: int = 1) -> dict[str, dict[str, float]]:
        """Mean/p90 TTFT, mean TPOT and E2E for all requests and for priority >= p_hi."""
        s = self.serving
        out: dict[str, dict[str, float]] = {}
        for name, mask in (("all", np.ones(len(self.priority), bool)),
                           ("priority", self.priority >= p_hi)):
            def stat(a: FloatArray, q: float | None = None, m: npt.NDArray[np.bool_] = mask
                     ) -> float:
                return nan_stat(a[m], q)
            out[name] = {"n": float(mask.sum()), "mean_ttft_s": stat(s.ttft_s),
                         "p90_ttft_s": stat(s.ttft_s, 90), "mean_tpot_s": stat(s.tpot_s),
                         "mean_e2e_s": stat(s.e2e_s)}
        return out

    def summary(self) -> dict[str, object]:
        return {**self.serving.summary(), "switches": self.switches,
                "classes": self.class_stats(),
                "timeline": [[c.t, c.width] for c in self.timeline]}


def _scaled(cost: StepCostModel, factor: float) -> StepCostModel:
    """The cost model with every step term multiplied by `factor` (all-reduce penalty)."""
    if factor == 1.0:
        return cost
    return dataclasses.replace(
        cost, lin=cost.lin * factor, head=cost.head * factor,
        decode_per_context_token=cost.decode_per_context_token * factor,
        decode_per_sequence=cost.decode_per_sequence * factor,
        step_overhead_s=cost.step_overhead_s * factor,
        decode_context_by_batch=cost.decode_context_by_batch * factor,
        decode_wave_by_batch=cost.decode_wave_by_batch * factor,
        decode_overhead_adjust_s=cost.decode_overhead_adjust_s * factor)


def _kv_tokens(model: ModelSpec, gpu: GPUSpec, tp: int, config: EngineConfig) -> int:
    if config.kv_capacity_tokens is not None:
        return config.kv_capacity_tokens
    plan = memory_plan(make_deployment(model, gpu, tp),
                       gpu_memory_utilization=config.gpu_memory_utilization,
                       max_batched_tokens=config.max_batched_tokens,
                       block_size=config.block_size)
    if not plan.fits:
        raise SpecError(f"{model.name} does not fit on {tp} x {gpu.name}")
    return plan.kv_capacity_tokens


def _check_widths(n_gpus: int, base_tp: int, widths: Sequence[int]) -> tuple[int, int]:
    if base_tp < 1 or n_gpus < base_tp or n_gpus % base_tp:
        raise SpecError(f"n_gpus {n_gpus} must be a positive multiple of base_tp {base_tp}")
    n = n_gpus // base_tp
    try:
        aligned_groups(n, widths)  # a width must be a power of two dividing n
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    return n, max(widths)


def max_context_tokens(model: ModelSpec | str, gpu: GPUSpec | str, n_gpus: int, base_tp: int,
                       mode: Literal["static", "flying"] = "static",
                       widths: Sequence[int] | None = None,
                       config: EngineConfig | None = None) -> int:
    """Longest single request (prompt + output tokens). "static": one TP = base_tp instance.
    "flying": the n_gpus / base_tp engines (each with its full weights) merged to the widest
    allowed width, their KV pooled (Table 2's Flying column: DP2 x TP4 merged to TP8)."""
    spec, g, cfg = get_model(model), get_gpu(gpu), config or EngineConfig()
    n = n_gpus // base_tp
    widths = tuple(widths) if widths is not None else (n,)
    _, widest = _check_widths(n_gpus, base_tp, widths)
    one = _kv_tokens(spec, g, base_tp, cfg)
    return one if mode == "static" else one * widest


def burst_trace(low: tuple[float, float] = (2.0, 5.0), high: tuple[float, float] = (10.0, 30.0),
                period_s: float = 60.0, burst_s: float = 20.0, duration: float = 600.0,
                input_tokens: int | Sequence[int] = 512, output_tokens: int | Sequence[int] = 256,
                n_requests: int | None = None, seed: int = 0) -> Workload:
    """The paper's trace shape (§6.1): low load (rate drawn in `low`) alternating with bursts
    (rate drawn in `high`) of `burst_s` every `period_s`; Poisson within each phase."""
    if period_s <= burst_s or burst_s <= 0 or duration <= 0:
        raise SpecError("need 0 < burst_s < period_s and duration > 0")
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t = 0.0
    while t < duration and (n_requests is None or len(times) < n_requests):
        for length, (lo, hi) in ((period_s - burst_s, low), (burst_s, high)):
            rate = float(rng.uniform(lo, hi))
            k = int(rng.poisson(rate * length))
            times.extend(sorted(t + rng.uniform(0, length, k)))
            t += length
    arr = np.array([x for x in times if x < duration], dtype=np.float64)
    if n_requests is not None:
        arr = arr[:n_requests]
    n = arr.size

    def lengths(spec: int | Sequence[int]) -> npt.NDArray[np.int64]:
        if isinstance(spec, int):
            return np.full(n, spec, dtype=np.int64)
        return np.asarray(rng.choice(np.asarray(spec), n), dtype=np.int64)

    return Workload(arr, lengths(input_tokens), lengths(output_tokens))


class _Group:
    __slots__ = ("engines", "replica", "rids", "served", "since")

    def __init__(self, engines: tuple[int, ...], replica: Replica, since: float) -> None:
        self.since = since
        self.engines = engines
        self.replica = replica
        self.rids: list[int] = []  # unfinished requests submitted to the merged batch
        self.served = False  # it has taken a request (then an empty batch may give back)


def _service_rate(cost: StepCostModel, mean_in: float, mean_out: float, batch: int = 32
                  ) -> float:
    """Requests/s a replica sustains at `batch` concurrent sequences (hysteresis's mu)."""
    step = cost.decode_step_time(batch, batch * (mean_in + mean_out / 2))
    prefill = cost.prefill_time([max(1, int(mean_in))]) * batch
    return batch / (prefill + max(1.0, mean_out) * step)


class _Flying:
    """The driver: DP replicas, bound groups, the driver queue and the policy loop."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, base_tp: int, n: int,
                 widths: tuple[int, ...], policy: SwitchPolicy, method: Method,
                 preempt_kv: PreemptKV, switch_latency_s: float,
                 penalty: dict[int, float], config: EngineConfig, book: RequestBook,
                 tokens: npt.NDArray[np.int64], prio: npt.NDArray[np.int64], p_hi: int | None
                 ) -> None:
        self.model, self.gpu, self.base_tp, self.n = model, gpu, base_tp, n
        self.widths, self.policy, self.method = widths, policy, method
        self.preempt_kv, self.latency, self.penalty = preempt_kv, switch_latency_s, penalty
        self.config, self.book, self.tokens, self.prio, self.p_hi = (config, book, tokens,
                                                                    prio, p_hi)
        cost = cost_model_for(make_deployment(model, gpu, base_tp))
        kv = _kv_tokens(model, gpu, base_tp, config)
        self.dp = [Replica(e, cost, config, kv, book) for e in range(n)]
        # the most one engine's KV can hold for one request (Replica.submit's own bound)
        self.one_engine = self.dp[0].capacity - config.block_size / 2.0
        self.groups: dict[tuple[int, ...], _Group] = {}
        # sequential/soft binds waiting for the requests their members held when asked
        self.binding: dict[tuple[int, ...], tuple[Method, list[int]]] = {}
        self.held: list[int] = []  # requests waiting at the driver for a bound group
        self.seen: set[int] = set()  # held requests the policy has observed
        self.bind_asked = False  # the policy's last call asked for (or kept) a group
        self.retired: list[Replica] = []
        self.timeline: list[ModeChange] = []
        self.mode_since = 0.0
        self.rate = 0.0
        self.last_t = 0.0
        self._next_index = n

    # --- views ------------------------------------------------------------------------
    def owner(self, e: int) -> _Group | None:
        for g in self.groups.values():
            if e in g.engines:
                return g
        return None

    def width(self) -> int:
        return max((len(g) for g in self.groups), default=1)

    def needs_group(self, rid: int) -> bool:
        if max(self.widths) == 1:
            return False
        urgent = self.p_hi is not None and self.prio[rid] >= self.p_hi
        return bool(urgent or self.tokens[rid] > self.one_engine)

    def unfinished(self, rids: list[int]) -> list[int]:
        fin, trunc = self.book.finish, self.book.truncated
        return [r for r in rids if math.isnan(fin[r]) and not trunc[r]]

    def state(self, t: float) -> SwitchState:
        n = self.n
        waiting, running, free = [0] * n, [0] * n, [0] * n
        for e, rep in enumerate(self.dp):
            waiting[e] = len(rep.waiting)
            running[e] = len(rep.running) + len(rep.prefilling)
            free[e] = int(rep.kv_free_tokens)
        prio_run = wide_run = 0
        for g in self.groups.values():
            rep, first = g.replica, g.engines[0]
            waiting[first] += len(rep.waiting)
            running[first] += len(rep.running) + len(rep.prefilling)
            g.served = g.served or bool(g.rids)
            g.rids = self.unfinished(g.rids)
            for e in g.engines:
                free[e] = int(rep.kv_free_tokens) // len(g.engines)
            for r in g.rids:
                prio_run = max(prio_run, int(self.prio[r]))
                wide_run += int(self.tokens[r] > self.one_engine)
        singles = [(e,) for e in range(n) if self.owner(e) is None]
        pending = tuple(Pending(int(self.tokens[r]), int(self.prio[r])) for r in self.held)
        return SwitchState(self.width(), tuple(sorted([*self.groups, *singles])),
                           tuple(waiting), tuple(running), tuple(free), self.widths, t,
                           self.mode_since, self.rate, pending, prio_run, wide_run)

    # --- time and switching -----------------------------------------------------------
    def advance(self, t: float) -> None:
        for rep in self.dp:
            rep.advance_to(t)
        for g in self.groups.values():
            g.replica.advance_to(t)

    def note(self, t: float) -> None:
        self.mode_since = t
        self.timeline.append(ModeChange(t, self.width(), tuple(sorted(self.groups))))

    def apply(self, t: float) -> None:
        actions = self.policy(self.state(t))
        self.seen = set(self.held)
        wanted = {a.engines for a in actions if isinstance(a, Bind)}
        self.bind_asked = bool(wanted)
        for engines in [g for g in self.binding if g not in wanted]:
            del self.binding[engines]  # the policy changed its mind before the drain ended
        for act in actions:
            if isinstance(act, Release):
                self.release(act.engines, t)
            elif isinstance(act, Bind):
                if act.engines in self.groups or any(self.owner(e) for e in act.engines):
                    continue
                if act.method == "hard":
                    self.bind(act.engines, t)
                elif act.engines not in self.binding:
                    old = [r for e in act.engines for r in _rids(self.dp[e])]
                    self.binding[act.engines] = (act.method, old)
        # work-conserving resume: a bound group with an empty batch gives its engines back
        # to the DP requests it paused (hard preempt: "resume DP with KV intact")
        for engines, g in list(self.groups.items()):
            if (g.replica.outstanding == 0 and not self.held
                    and (g.served or t - g.since >= GIVE_BACK_S)
                    and any(self.dp[e].outstanding for e in engines)):
                self.release(engines, t)
        for engines, (method, old) in list(self.binding.items()):
            if not self.unfinished(old):
                del self.binding[engines]
                self.bind(engines, t, fold=method == "soft")

    def bind(self, engines: tuple[int, ...], t: float, fold: bool = False) -> None:
        members = [self.dp[e] for e in engines]
        if self.preempt_kv == "recompute" or fold:
            for rep in members:
                running = set(rep.running) | {it[0] for it in rep.prefilling}
                for rid in running:
                    self.book.preemptions[rid] += 1
                    rep.preemptions += 1
                for entry in reversed(rep.take_all()):
                    rep.requeue(entry, front=True)
        free = sum(max(0.0, rep.kv_free_tokens) for rep in members)
        kv = int(free / (1.0 - self.config.watermark))
        if kv < self.config.block_size:
            return  # the members' KV is full: no room for a merged batch
        w = len(engines)
        dep = make_deployment(self.model, self.gpu, w * self.base_tp)
        cost = _scaled(cost_model_for(dep), self.penalty.get(w, 1.0))
        rep = Replica(self._next_index, cost, self.config, kv, self.book)
        self._next_index += 1
        for m in members:
            m.pause(t)
        rep.resume(t + self.latency)
        group = _Group(engines, rep, t)
        for m in members:  # queued requests hold no KV yet: they move to the merged batch
            while m.waiting:
                entry = m.waiting.popleft()
                m.queued_tokens -= entry[1]
                rep.requeue(entry)
                group.rids.append(entry[0])
        self.groups[engines] = group
        self.note(t)

    def release(self, engines: tuple[int, ...], t: float) -> None:
        g = self.groups.pop(engines, None)
        if g is None:
            return
        start = max(t, g.replica.now) + self.latency
        members = [self.dp[e] for e in engines]
        for entry in g.replica.take_all():
            min(members, key=lambda r: (r.outstanding, r.index)).requeue(entry)
        for m in members:
            m.resume(start)
        self.retired.append(g.replica)
        self.note(t)

    # --- routing ----------------------------------------------------------------------
    def route(self, rid: int, prompt: int, output: int) -> None:
        if self.needs_group(rid):
            self.held.append(rid)
            return
        busy = {e for g, (m, _) in self.binding.items() if m == "sequential" for e in g}
        best: tuple[float, int] | None = None
        target: Replica | _Group | None = None
        for e, rep in enumerate(self.dp):
            if e not in busy and self.owner(e) is None:
                key = (float(rep.outstanding), e)
                if best is None or key < best:
                    best, target = key, rep
        for g in self.groups.values():
            key = (g.replica.outstanding / len(g.engines), g.engines[0])
            if best is None or key < best:
                best, target = key, g
        if target is None:
            self.held.append(rid)
        elif isinstance(target, _Group):
            self.submit(target.replica, rid, prompt, output)
            target.rids.append(rid)
        else:
            self.submit(target, rid, prompt, output)

    def urgent(self, rid: int) -> bool:
        return self.p_hi is not None and bool(self.prio[rid] >= self.p_hi)

    def submit(self, rep: Replica, rid: int, prompt: int, output: int) -> None:
        """Queue a request; a priority one goes ahead of every normal request still waiting
        (FIFO among priority requests), as the torch engine admits them."""
        before = len(rep.waiting)
        rep.submit(rid, prompt, output)
        if not self.urgent(rid) or len(rep.waiting) == before:
            return
        entry = rep.waiting.pop()
        ahead = 0
        while ahead < len(rep.waiting) and self.urgent(rep.waiting[ahead][0]):
            ahead += 1
        rep.waiting.insert(ahead, entry)

    def route_dp(self, rid: int, prompt: int, output: int) -> bool:
        """A priority request the policy forms no group for runs on the least-loaded free
        DP engine, ahead of its normal queue (False: every engine is bound or binding)."""
        busy = {e for g in self.binding for e in g}
        free = [(rep.outstanding, e) for e, rep in enumerate(self.dp)
                if e not in busy and self.owner(e) is None]
        if not free:
            return False
        self.submit(self.dp[min(free)[1]], rid, prompt, output)
        return True

    def dispatch_held(self, inputs: npt.NDArray[np.int64], outputs: npt.NDArray[np.int64]
                      ) -> None:
        held, self.held = self.held, []
        keep: list[int] = []
        for rid in held:
            if not self.needs_group(rid):
                self.route(rid, int(inputs[rid]), int(outputs[rid]))  # may hold it again
                continue
            fits = [g for g in self.groups.values()
                    if g.replica.capacity - self.config.block_size / 2.0 >= self.tokens[rid]]
            if not fits:
                # the policy saw it and forms no group: a priority request that one engine
                # holds runs in DP (priority admission) instead of waiting for one
                if (rid not in self.seen or self.bind_asked or self.groups or self.binding
                        or self.tokens[rid] > self.one_engine
                        or not self.route_dp(rid, int(inputs[rid]), int(outputs[rid]))):
                    keep.append(rid)
                continue
            g = min(fits, key=lambda g: (g.replica.outstanding / len(g.engines), g.engines))
            self.submit(g.replica, rid, int(inputs[rid]), int(outputs[rid]))
            g.rids.append(rid)
        self.held = keep + self.held

    def idle(self) -> bool:
        return (not self.held and all(r.outstanding == 0 for r in self.dp)
                and all(g.replica.outstanding == 0 for g in self.groups.values()))


def _default_policy(name: str, method: Method, model: ModelSpec, gpu: GPUSpec, base_tp: int,
                    n: int, widths: tuple[int, ...], workload: Workload,
                    options: dict[str, object], config: EngineConfig) -> SwitchPolicy:
    opts = dict(options)
    if name != "priority":
        opts.setdefault("method", method)
    if name in ("hysteresis", "priority") and "mu_tp" not in opts:
        w = max(x for x in widths if n % x == 0)
        cost = cost_model_for(make_deployment(model, gpu, w * base_tp))
        # priority: the rate past which the widest group's queue grows (a full batch)
        batch = config.max_num_seqs if name == "priority" else 32
        opts["mu_tp"] = _service_rate(cost, max(1.0, workload.mean_input()),
                                      max(1.0, workload.mean_output()), batch)
    return make_policy(name, **opts)


def simulate_flying(model: ModelSpec | str, gpu: GPUSpec | str, n_gpus: int, base_tp: int,
                    workload: Workload, *, widths: Sequence[int] = (1, 2),
                    policy: str | SwitchPolicy = "hysteresis",
                    policy_options: dict[str, object] | None = None,
                    method: Method = "hard", preempt_kv: PreemptKV = "keep",
                    switch_latency_s: float = 0.015,
                    dtp_allreduce_penalty: dict[int, float] | None = None,
                    priority: Sequence[int] | npt.NDArray[np.int64] | None = None,
                    p_hi: int = 1, slo: SLO | None = None, config: EngineConfig | None = None,
                    control_interval_s: float = 0.05, seed: int = 0) -> FlyingResult:
    """Serve `workload` on n_gpus / base_tp DP engines that bind and release under `policy`
    (a name in SWITCH_POLICIES with `policy_options`, or a SwitchPolicy). The policy runs at
    every arrival and every `control_interval_s`. `widths=(1,)` is static DP. `seed` is
    accepted for API symmetry (the driver itself is deterministic)."""
    del seed
    spec, g = get_model(model), get_gpu(gpu)
    widths_t = tuple(sorted(set(widths) | {1}))
    n, _ = _check_widths(n_gpus, base_tp, widths_t)
    if method not in ("sequential", "soft", "hard"):
        raise SpecError(f"unknown method {method!r}")
    if preempt_kv not in ("keep", "recompute"):
        raise SpecError(f"preempt_kv must be 'keep' or 'recompute', not {preempt_kv!r}")
    if switch_latency_s < 0 or control_interval_s <= 0:
        raise SpecError("switch_latency_s must be >= 0 and control_interval_s > 0")
    cfg = config or EngineConfig()
    m = len(workload)
    prio = (np.zeros(m, np.int64) if priority is None
            else np.asarray(priority, dtype=np.int64))
    if prio.shape != (m,):
        raise SpecError("priority needs one entry per request")
    pol = (policy if not isinstance(policy, str) else
           _default_policy(policy, method, spec, g, base_tp, n, widths_t, workload,
                           policy_options or {}, cfg))
    arrival = workload.arrival_s.astype(np.float64)
    inputs = workload.input_tokens.astype(np.int64)
    outputs = workload.output_tokens.astype(np.int64)
    book = RequestBook(arrival.tolist(), inputs.tolist(), outputs.tolist())
    # priority requests wait for a group only under a priority-aware policy (a callable may be)
    hold = p_hi if not isinstance(policy, str) or policy == "priority" else None
    fly = _Flying(spec, g, base_tp, n, widths_t, pol, method, preempt_kv, switch_latency_s,
                  dict(dtp_allreduce_penalty or {}), cfg, book, inputs + outputs, prio, hold)
    st: list[float] = []
    sw: list[int] = []
    sq: list[int] = []
    sr: list[float] = []
    i, tick, idle_ticks, drain_ticks, last = 0, 0.0, 0, 0, 0.0
    while True:
        is_arrival = i < m and arrival[i] <= tick
        t = float(arrival[i]) if is_arrival else tick
        fly.advance(t)
        fly.rate = ewma_rate(fly.rate, t - last, 1 if is_arrival else 0)
        last = t if t > last else last
        if is_arrival:  # routed first, so the policy sees a held arrival at once
            fly.route(i, int(inputs[i]), int(outputs[i]))
            i += 1
        fly.apply(t)
        fly.dispatch_held(inputs, outputs)
        if not is_arrival:
            st.append(t)
            sw.append(fly.width())
            sq.append(len(fly.held) + sum(len(r.waiting) for r in fly.dp)
                      + sum(len(x.replica.waiting) for x in fly.groups.values()))
            sr.append(fly.rate)
            tick += control_interval_s
            if i >= m:
                idle_ticks = idle_ticks + 1 if fly.idle() or _stuck(fly) else 0
                drain_ticks += 1
                if fly.idle() or idle_ticks > 200 or drain_ticks > MAX_DRAIN_TICKS:
                    break
    for rid in range(m):  # held by no group, or cut off by MAX_DRAIN_TICKS
        if math.isnan(book.finish[rid]):
            book.truncated[rid] = True
    reps = [*fly.dp, *fly.retired, *(x.replica for x in fly.groups.values())]
    busy = [(r.busy_start, r.busy_end) for r in reps]
    result = build_result(arrival, inputs, outputs, np.array(book.first_token),
                          np.array(book.finish), np.array(book.truncated),
                          np.array(book.replica, dtype=np.int64),
                          sum(r.preemptions for r in reps), slo, busy)
    return FlyingResult(result, tuple(fly.timeline), prio, np.array(st), np.array(sw),
                        np.array(sq), np.array(sr))


def _rids(rep: Replica) -> list[int]:
    return ([e[0] for e in rep.waiting] + [it[0] for it in rep.prefilling]
            + list(rep.running))


def _stuck(fly: _Flying) -> bool:
    """Only held requests remain and nothing runs that could change the policy's mind."""
    return bool(fly.held) and all(r.outstanding == 0 for r in fly.dp) and all(
        x.replica.outstanding == 0 for x in fly.groups.values())
