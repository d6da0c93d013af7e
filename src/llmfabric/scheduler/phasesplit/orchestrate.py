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
from llmfabric.scheduler.phasesplit.config import MAX_NUM_SEQS, ReplicaConfig
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.parallel import kv_transfer_bytes

Array = npt.NDArray[np.float64]
MAX_UTILIZATION = 0.9
GRID = 12


@dataclass(frozen=True, eq=False)
class Routing:
    x: Array          # m: share of served requests to prefill replica i
    y: Array          # m x n: share of i's requests whose KV goes to decode replica j
    z: Array          # m x n: share of ALL requests on pair (i, j)
    unserved: float   # share the capacities leave unserved
    attainment: float  # share of all requests served within the SLO (LP objective)


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
    z = [[solver.NumVar(0.0, 1.0, f"z{i}_{j}") for j in range(n)] for i in range(m)]
    u = solver.NumVar(0.0, 1.0, "u")
    solver.Add(sum(z[i][j] for i in range(m) for j in range(n)) + u == 1.0)
    for i in range(m):
        solver.Add(rate * sum(z[i][j] for j in range(n)) <= float(min(av[i], 1e12)))
    for j in range(n):
        solver.Add(rate * sum(z[i][j] for i in range(m)) <= float(min(bv[j], 1e12)))
    solver.Maximize(sum(float(dm[i, j]) * z[i][j] for i in range(m) for j in range(n)))
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
    """Everything D_ij needs for one set of prefill and decode replicas."""

    def __init__(self, prefill: Sequence[ReplicaConfig], decode: Sequence[ReplicaConfig],
                 cluster: CloudCluster, model: ModelSpec, workload: PDWorkload,
                 kv_bits: int | None, kv_group: int) -> None:
        self.pre, self.dec, self.wl = list(prefill), list(decode), workload
        ins = workload.in_lengths.astype(np.float64)
        self.ins, self.outs = ins, workload.out_lengths.astype(np.float64)
        grid = np.unique(np.linspace(ins.min(), ins.max(), GRID).round())
        self.prefill_s = np.array([np.interp(ins, grid, [r.prefill_time(int(g)) for g in grid])
                                   for r in self.pre])                      # m x S
        self.mean_s = self.prefill_s.mean(axis=1)
        self.a = np.array([self._prefill_capacity(r.latency_s) for r in self.pre])
        self.ctx = workload.mean_in + workload.mean_out / 2
        self.b = np.array([self._decode_capacity(r) for r in self.dec]) / workload.mean_out
        per_token_layer = kv_transfer_bytes(model, 1, kv_bits, kv_group) / model.n_layers
        self.kv_s = np.zeros((len(self.pre), len(self.dec), len(ins)))
        for i, p in enumerate(self.pre):
            for j, q in enumerate(self.dec):
                self.kv_s[i, j] = self._transfer(p, q, cluster, per_token_layer)

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
        one), times the utilisation cap: the LP must not load a decode replica past it."""
        b_max = max(1, int(r.kv_capacity_tokens // self.ctx))
        b_max = min(b_max, MAX_NUM_SEQS)
        tpot = self.wl.slo.tpot_s
        lo, hi = 1, b_max
        if tpot is not None:
            if r.decode_step_time(1, self.ctx) > tpot:
                return 0.0
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if r.decode_step_time(mid, self.ctx) <= tpot:
                    lo = mid
                else:
                    hi = mid - 1
        else:
            lo = b_max
        return MAX_UTILIZATION * lo / r.decode_step_time(lo, self.ctx)

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

    def tpot(self, j: int, lam: float) -> float:
        """Decode step time at the Little's-law batch for arrival rate `lam` (inf: overload)."""
        r = self.dec[j]
        if lam * self.wl.mean_out >= r.throughput_tps:
            return float("inf")
        b_max = min(MAX_NUM_SEQS, max(1, int(r.kv_capacity_tokens // self.ctx)))
        batch = 1.0
        step = r.decode_step_time(1, self.ctx)
        for _ in range(30):
            batch = max(1.0, lam * self.wl.mean_out * step)
            if batch > b_max:
                return float("inf")
            new = r.decode_step_time(max(1, round(batch)), self.ctx)
            if abs(new - step) < 1e-6:
                break
            step = new
        return step

    def _tpot_share(self, j: int, lam: float, tpot: float) -> float:
        """Share of requests on j meeting the TPOT deadline: the batch a request decodes in
        is 1 + Poisson(Little's-law mean) (arrivals are Poisson), and a step of that batch
        must meet the deadline."""
        if not np.isfinite(tpot):
            return 0.0
        deadline = self.wl.slo.tpot_s
        if deadline is None:
            return 1.0
        r = self.dec[j]
        mean = lam * self.wl.mean_out * tpot
        k = np.arange(0, MAX_NUM_SEQS + 1)
        log_pmf = k * np.log(max(mean, 1e-12)) - mean - np.array([math.lgamma(v + 1) for v in k])
        pmf = np.exp(log_pmf)
        steps = np.array([r.decode_step_time(int(v) + 1, self.ctx) for v in k[::8]])
        ok = np.repeat(steps <= deadline, 8)[: len(k)]
        return float(min(1.0, (pmf * ok).sum()))

    def attainment(self, lam_pre: Array, lam_dec: Array) -> Array:
        """D (m x n) at the given per-replica arrival rates."""
        slo = self.wl.slo
        m, n = len(self.pre), len(self.dec)
        rho = lam_pre * self.mean_s
        wait = np.where(rho < 1, rho * self.mean_s / (2 * np.maximum(1e-12, 1 - rho)), np.inf)
        ttft = wait[:, None] + self.prefill_s                       # m x S
        tpot = np.array([self.tpot(j, float(lam_dec[j])) for j in range(n)])
        ok_pre = np.ones_like(ttft, dtype=bool) if slo.ttft_s is None else ttft <= slo.ttft_s
        p_dec = np.array([self._tpot_share(j, float(lam_dec[j]), tpot[j]) for j in range(n)])
        d = np.zeros((m, n))
        for j in range(n):
            if p_dec[j] <= 0:
                continue
            e2e = ttft + self.kv_s[:, j, :] + self.outs[None, :] * tpot[j]
            ok = ok_pre & np.isfinite(e2e)
            if slo.e2e_s is not None:
                ok &= e2e <= slo.e2e_s
            d[:, j] = ok.mean(axis=1) * p_dec[j]
        return d

    def _rescore(self, r: Routing) -> Routing:
        """The routing's attainment at the loads it implies (served requests only)."""
        d = self.attainment(self.wl.rate * r.z.sum(axis=1), self.wl.rate * r.z.sum(axis=0))
        return Routing(r.x, r.y, r.z, r.unserved, float((r.z * d).sum()))

    def route(self, orchestrate: bool = True, passes: int = 2) -> Routing:
        """Capacity-proportional loads first, then the LP, re-solved at the loads of its
        previous answer; every candidate is scored at its own loads and the best returned
        (the LP packs replicas up to their capacities, which can score below the
        proportional start)."""
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
            scored = Routing(routing.x, routing.y, routing.z, routing.unserved,
                             float((routing.z * d).sum()))
            if scored.attainment > best.attainment + 1e-12:
                best = scored
        return best
