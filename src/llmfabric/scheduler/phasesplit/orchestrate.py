"""Orchestration (ThunderServe §3.3, COMPANIONS.md §1.3b / Appendix A.1): the routing LP over
z_ij = X_i Y_ij with capacities (OR-Tools GLOP), and the analytic pair attainment D_ij.

D_ij on a fixed sample of request lengths: TTFT = M/D/1 wait at rho_i = lambda_i s_i plus the
prefill time of the prompt; the KV transfer over the stage-pair links (true GQA bytes,
quantized with its metadata); TPOT_j = the decode step time at the Little's-law batch on j;
E2E = TTFT + transfer + out x TPOT. D_ij = share of the sample meeting every deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.scheduler.errors import SolverError, SpecError
from llmfabric.scheduler.phasesplit.config import (
    MAX_NUM_SEQS,
    ReplicaConfig,
    decode_context,
    decode_seats,
    slo_batch,
)
from llmfabric.scheduler.phasesplit.pairmemo import PairMemo
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.scheduler.phasesplit.stability import overload_share
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.parallel import kv_transfer_bytes

Array = npt.NDArray[np.float64]
MAX_UTILIZATION = 0.9
GRID = 12
_K = np.arange(0, MAX_NUM_SEQS + 1)
_LOG_FACT = np.array([math.lgamma(v + 1) for v in _K])
# step times by batch per replica cost model (the object is kept so its id stays unique)
_STEPS: dict[tuple[int, int], tuple[object, npt.NDArray[np.float64]]] = {}


@dataclass(frozen=True, eq=False)
class Routing:
    x: Array          # m: share of served requests to prefill replica i
    y: Array          # m x n: share of i's requests whose KV goes to decode replica j
    z: Array          # m x n: share of ALL requests on pair (i, j)
    unserved: float   # share the capacities leave unserved
    attainment: float  # share of all requests served within the SLO (LP objective)
    # share of requests replicas get beyond the headroom (stability.overload_share), and
    # each replica's predicted utilisation (None: not computed, e.g. a saved plan)
    overload: float = 0.0
    load_prefill: Array | None = None
    load_decode: Array | None = None

    @property
    def score(self) -> float:
        """What plans are ranked by: attainment with the load beyond the headroom missed."""
        return self.attainment - self.overload


def solve_routing(d: npt.ArrayLike, a: npt.ArrayLike, b: npt.ArrayLike,
                  rate: float) -> Routing:
    """max sum D_ij z_ij s.t. sum z + u = 1, rate sum_j z_ij <= a_i, rate sum_i z_ij <= b_j."""
    from ortools.linear_solver import pywraplp

    dm = np.asarray(d, dtype=np.float64)
    av, bv = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if dm.ndim != 2 or dm.shape != (av.size, bv.size) or dm.size == 0:
        raise SpecError(f"D is {dm.shape}, capacities {av.size} and {bv.size}")
    if not (rate > 0) or not np.all(np.isfinite(dm)) or np.any(av < 0) or np.any(bv < 0):
        raise SpecError("D must be finite, capacities >= 0 and the rate > 0")
    m, n = dm.shape
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with ortools
        raise SolverError("OR-Tools GLOP is unavailable")
    # built through the constraint API (the natural `sum(...) <= c` API costs more than
    # the solve at these sizes); the same rows in the same order
    z = [[solver.NumVar(0.0, 1.0, f"z{i}_{j}") for j in range(n)] for i in range(m)]
    u = solver.NumVar(0.0, 1.0, "u")
    total = solver.Constraint(1.0, 1.0)
    for row in z:
        for var in row:
            total.SetCoefficient(var, 1.0)
    total.SetCoefficient(u, 1.0)
    for i in range(m):
        ci = solver.Constraint(-solver.infinity(), float(min(av[i], 1e12)))
        for j in range(n):
            ci.SetCoefficient(z[i][j], rate)
    for j in range(n):
        cj = solver.Constraint(-solver.infinity(), float(min(bv[j], 1e12)))
        for i in range(m):
            cj.SetCoefficient(z[i][j], rate)
    objective = solver.Objective()
    for i in range(m):
        for j in range(n):
            objective.SetCoefficient(z[i][j], float(dm[i, j]))
    objective.SetMaximization()
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise SolverError(f"the routing LP ended with status {status}, not OPTIMAL")
    zv = np.clip(np.array([[z[i][j].solution_value() for j in range(n)] for i in range(m)]),
                 0.0, 1.0)
    served = float(zv.sum())
    rows = zv.sum(axis=1)
    x = rows / served if served > 1e-12 else np.zeros(m)
    y = np.where(rows[:, None] > 1e-12, zv / np.maximum(rows[:, None], 1e-300), 1.0 / n)
    return Routing(x, y, zv, max(0.0, 1.0 - served), float(solver.Objective().Value()))


def proportional_routing(d: Array, a: Array, b: Array) -> Routing:
    """No orchestration (Fig. 12 ablation): X by prefill capacity, Y by decode capacity,
    blind to the links and to D; every request is dispatched."""
    x = a / a.sum() if a.sum() > 0 else np.full(len(a), 1 / len(a))
    y = np.tile(b / b.sum() if b.sum() > 0 else np.full(len(b), 1 / len(b)), (len(a), 1))
    z = x[:, None] * y
    return Routing(x, y, z, 0.0, float((z * d).sum()))


class PairModel:
    """Everything D_ij needs for one set of prefill and decode replicas. `headroom`: the
    most a replica may be loaded (utilisation; stability.py): the LP's capacities stop there,
    and a routing beyond it (the proportional start) is scored with the excess missed."""

    def __init__(self, prefill: Sequence[ReplicaConfig], decode: Sequence[ReplicaConfig],
                 cluster: CloudCluster, model: ModelSpec, workload: PDWorkload,
                 kv_bits: int | None, kv_group: int, memo: PairMemo | None = None, *,
                 headroom: float = MAX_UTILIZATION) -> None:
        if not 0 < headroom <= 1:
            raise SpecError("headroom must be in (0, 1]")
        self.pre, self.dec, self.wl, self.headroom = list(prefill), list(decode), workload, \
            headroom
        if memo is not None and not memo.usable(cluster, model, workload, kv_bits, kv_group):
            memo = None
        ins = workload.in_lengths.astype(np.float64)
        self.ins, self.outs = ins, workload.out_lengths.astype(np.float64)
        self.mean_out = float(self.outs.mean())
        self._grid = np.unique(np.linspace(ins.min(), ins.max(), GRID).round())
        self.prefill_s = np.array([self._prefill_row(r, memo) for r in self.pre])  # m x S
        self.mean_s = self.prefill_s.mean(axis=1)
        cap = min(headroom, MAX_UTILIZATION)
        self.a = np.array([min(self._prefill_capacity(r.latency_s), headroom / s)
                           for r, s in zip(self.pre, self.mean_s, strict=True)])
        self.ctx = decode_context(workload)
        # TPOT-bound tokens/s per decode replica (utilisation's denominator)
        self.tps = np.array([self._memo_capacity(r, memo) for r in self.dec])
        self.b = cap * self.tps / self.mean_out
        per_token_layer = kv_transfer_bytes(model, 1, kv_bits, kv_group) / model.n_layers
        self.kv_s = np.zeros((len(self.pre), len(self.dec), len(ins)))
        for i, p in enumerate(self.pre):
            for j, q in enumerate(self.dec):
                if memo is None:
                    self.kv_s[i, j] = self._transfer(p, q, cluster, per_token_layer)
                    continue
                key = (tuple((s.gpus, s.layers) for s in p.stages),
                       tuple((s.gpus, s.layers) for s in q.stages))
                row = memo.transfer.get(key)
                if row is None:
                    row = memo.transfer[key] = self._transfer(p, q, cluster, per_token_layer)
                self.kv_s[i, j] = row

    def _prefill_row(self, r: ReplicaConfig, memo: PairMemo | None) -> Array:
        """Prefill seconds of every sampled prompt (interpolated on a grid of lengths)."""
        got = memo.prefill.get(id(r.step)) if memo is not None else None
        if got is not None and got[0] is r.step:
            return got[1]
        row = np.interp(self.ins, self._grid, [r.prefill_time(int(g)) for g in self._grid])
        if memo is not None:
            memo.prefill[id(r.step)] = (r.step, row)
        return row

    def _memo_capacity(self, r: ReplicaConfig, memo: PairMemo | None) -> float:
        key = (id(r.step), r.kv_capacity_tokens)
        got = memo.capacity.get(key) if memo is not None else None
        if got is not None and got[0] is r.step:
            return got[1]
        cap = self._decode_capacity(r)
        if memo is not None:
            memo.capacity[key] = (r.step, cap)
        return cap

    def _prefill_capacity(self, s: float) -> float:
        """Requests/s: utilisation <= rho_max, and with a TTFT deadline the M/D/1 wait of a
        mean prompt within half its slack (the LP would otherwise fill a replica to the
        point where the mean prompt just misses)."""
        rho = MAX_UTILIZATION
        ttft = self.wl.slo.ttft_s
        if ttft is not None and ttft > s:
            w = (ttft - s) / 2
            rho = min(rho, 2 * w / (s + 2 * w))
        return rho / s

    def _decode_capacity(self, r: ReplicaConfig) -> float:
        """Tokens/s at the largest batch whose step meets the TPOT deadline (B_max without
        one); the LP loads a decode replica up to the utilisation cap of it."""
        lo = slo_batch(lambda k: r.decode_step_time(k, self.ctx),
                       decode_seats(r.kv_capacity_tokens, self.ctx), self.wl.slo.tpot_s)
        if lo == 0:
            return 0.0
        return lo / r.decode_step_time(lo, self.ctx)

    def loads(self, lam_pre: Array, lam_dec: Array) -> tuple[Array, Array]:
        """Predicted utilisation per replica at these arrival rates: prefill busy time per
        second (lambda x mean prefill time, the M/D/1's rho), decode token demand over the
        TPOT-bound tokens/s (inf for a loaded replica that cannot meet the deadline)."""
        rho_dec = np.where(self.tps > 0, lam_dec * self.mean_out / np.maximum(self.tps, 1e-300),
                           np.where(lam_dec > 0, np.inf, 0.0))
        return lam_pre * self.mean_s, rho_dec

    def with_loads(self, r: Routing) -> Routing:
        """`r` with its replicas' utilisation and the share beyond the headroom."""
        lam_pre, lam_dec = self.wl.rate * r.z.sum(axis=1), self.wl.rate * r.z.sum(axis=0)
        rho_pre, rho_dec = self.loads(lam_pre, lam_dec)
        over = overload_share(np.concatenate([lam_pre, lam_dec]),
                              np.concatenate([rho_pre, rho_dec]), self.headroom,
                              self.wl.rate)
        return Routing(r.x, r.y, r.z, r.unserved, r.attainment, over, rho_pre, rho_dec)

    def _transfer(self, p: ReplicaConfig, q: ReplicaConfig, cluster: CloudCluster,
                  per_token_layer: float) -> Array:
        """Staged transfer: every stage pair holding common layers ships them in parallel."""
        t = np.zeros_like(self.ins)
        lp = np.cumsum([0] + [s.layers for s in p.stages])
        lq = np.cumsum([0] + [s.layers for s in q.stages])
        for a, sp in enumerate(p.stages):
            for b, sq in enumerate(q.stages):
                overlap = min(lp[a + 1], lq[b + 1]) - max(lp[a], lq[b])
                if overlap <= 0:
                    continue
                link = cluster.link(sp.gpus, sq.gpus)
                if link.bandwidth == np.inf:
                    continue
                t = np.maximum(t, link.latency_s + overlap * per_token_layer * self.ins
                               / link.bandwidth)
        return t

    def decode_step(self, j: int, lam: float) -> float:
        """Decode step time at the Little's-law batch for arrival rate `lam` (inf: overload)."""
        r = self.dec[j]
        # past rho_max of its tokens/s a decode replica queues for KV seats far longer than
        # any queueing formula here predicts (the simulator's prefill bursts): overload
        if lam * self.mean_out > MAX_UTILIZATION * r.throughput_tps:
            return float("inf")
        b_max = self.b_max(j)
        step = r.decode_step_time(1, self.ctx)
        for _ in range(30):
            batch = max(1.0, lam * self.mean_out * step)
            if batch > b_max:
                return float("inf")
            new = r.decode_step_time(max(1, round(batch)), self.ctx)
            if abs(new - step) < 1e-6:
                break
            step = new
        return step

    def b_max(self, j: int) -> int:
        return decode_seats(self.dec[j].kv_capacity_tokens, self.ctx)

    def slot_wait(self, j: int, lam: float, step: float) -> float:
        """Mean wait for a decode seat (KV room for one more sequence): M/M/c with c = B_max
        seats, each held for mean_out steps (Erlang C). Near saturation this dominates: a
        replica at 97 % of its tokens/s queues requests for whole generations."""
        if not np.isfinite(step):
            return float("inf")
        c = self.b_max(j)
        service = self.mean_out * step
        offered = lam * service
        if offered >= c:
            return float("inf")
        erlang_b = 1.0
        for k in range(1, c + 1):
            erlang_b = offered * erlang_b / (k + offered * erlang_b)
        erlang_c = c * erlang_b / (c - offered * (1 - erlang_b))
        return erlang_c * service / (c - offered)

    def tpot(self, j: int, lam: float) -> float:
        """Per-output-token time: the step at the Little's-law batch plus the seat wait spread
        over the mean output (inf: overload)."""
        step = self.decode_step(j, lam)
        return step + self.slot_wait(j, lam, step) / self.mean_out

    def _batch_step_cdf(self, j: int, step: float, lam: float
                        ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(step time of the batch a request decodes in, cumulative probability), batch =
        1 + Poisson(Little's-law mean) (Poisson arrivals), sorted by step time."""
        r = self.dec[j]
        mean = lam * self.mean_out * step
        log_pmf = _K * np.log(max(mean, 1e-12)) - mean - _LOG_FACT
        key = (id(r.step), round(self.ctx))
        got = _STEPS.get(key)
        if got is None or got[0] is not r.step:
            coarse = np.array([r.decode_step_time(int(v) + 1, self.ctx) for v in _K[::8]])
            got = (r.step, np.maximum.accumulate(np.repeat(coarse, 8)[: len(_K)]))
            if len(_STEPS) > 4096:
                _STEPS.clear()
            _STEPS[key] = got
        return got[1], np.cumsum(np.exp(log_pmf))

    def attainment(self, lam_pre: Array, lam_dec: Array) -> Array:
        """D (m x n) at the given per-replica arrival rates. A request's TPOT is measured as
        the simulator does, (finish - first token) / (out - 1): its KV transfer and seat wait
        count, spread over its output."""
        slo = self.wl.slo
        m, n = len(self.pre), len(self.dec)
        rho = lam_pre * self.mean_s
        wait = np.where(rho < 1, rho * self.mean_s / (2 * np.maximum(1e-12, 1 - rho)), np.inf)
        ttft = wait[:, None] + self.prefill_s                       # m x S
        ok_pre = np.ones_like(ttft, dtype=bool) if slo.ttft_s is None else ttft <= slo.ttft_s
        spread = np.maximum(self.outs - 1, 1)[None, :]
        d = np.zeros((m, n))
        for j in range(n):
            lam = float(lam_dec[j])
            step = self.decode_step(j, lam)
            seat = self.slot_wait(j, lam, step)
            if not (np.isfinite(step) and np.isfinite(seat)):
                continue
            e2e = ttft + self.kv_s[:, j, :] + seat + self.outs[None, :] * step
            ok = ok_pre & np.isfinite(e2e)
            if slo.e2e_s is not None:
                ok &= e2e <= slo.e2e_s
            p_tpot = np.ones_like(e2e)
            if slo.tpot_s is not None:
                steps, cdf = self._batch_step_cdf(j, step, lam)
                room = slo.tpot_s - (self.kv_s[:, j, :] + seat) / spread
                idx = np.searchsorted(steps, room, side="right")
                p_tpot = np.where(idx > 0, cdf[np.maximum(idx - 1, 0)], 0.0)
                p_tpot = np.where(self.outs[None, :] > 1, p_tpot, 1.0)
            d[:, j] = (ok * p_tpot).mean(axis=1)
        return d

    def _rescore(self, r: Routing) -> Routing:
        """The routing's attainment at the loads it implies (served requests only)."""
        d = self.attainment(self.wl.rate * r.z.sum(axis=1), self.wl.rate * r.z.sum(axis=0))
        return self.with_loads(Routing(r.x, r.y, r.z, r.unserved, float((r.z * d).sum())))

    def route(self, orchestrate: bool = True, passes: int = 2) -> Routing:
        """Capacity-proportional loads first, then the LP, re-solved at the loads of its
        previous answer; every candidate is scored at its own loads and the best returned
        (the LP packs replicas up to their capacities, which can score below the
        proportional start). Scores count the load beyond the headroom as missed."""
        rate = self.wl.rate
        start = proportional_routing(np.zeros((len(self.a), len(self.b))), self.a, self.b)
        d = self.attainment(rate * start.z.sum(axis=1), rate * start.z.sum(axis=0))
        best = self._rescore(start)
        if not orchestrate:
            return best
        for _ in range(passes + 1):
            routing = solve_routing(d, self.a, self.b, rate)
            lam_pre = rate * routing.z.sum(axis=1)
            lam_dec = rate * routing.z.sum(axis=0)
            d = self.attainment(lam_pre, lam_dec)
            scored = self.with_loads(Routing(routing.x, routing.y, routing.z,
                                             routing.unserved, float((routing.z * d).sum())))
            if scored.score > best.score + 1e-12:
                best = scored
        return best
