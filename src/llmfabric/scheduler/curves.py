"""One replica's estimates as a function of its arrival rate, with an explicit capacity.

A replica serves at most its service rate: the completion rate the performance model reports
when the replica is overloaded (its batch full; `Estimate.throughput_rps` of a saturated
estimate). Offered more, its queue grows without bound, and what a finite-window estimate
reports as its "mean latency" is an artefact of the window (it grows with it). Offered
exactly its service rate, it is critically loaded and its queue still grows (as sqrt(t)). So
the planner gives a replica at most its *capacity* mu = max_utilization x service rate (0.9 by
default) and prices load above that as *unserved*, charged the same penalty as load no replica
takes. The latency cost per second of one replica offered x is then

    h(x) = x * L(x)                              x <= mu
    h(x) = mu * L(mu) + (x - mu) * penalty       x >  mu

convex at the capacity kink (its slope jumps to the penalty), so the convex formulation's
envelope is tight there, and no objective depends on the estimator's window.

The service rate comes from the estimate at the top of the grid (the model's whole rate on one
replica) when that replica is saturated there; if the estimate at mu itself reports saturation
(the estimator's own test), mu is lowered by bisection to the largest rate it does not.
`mu` is added to the grid as a sample point so interpolation never straddles the kink.
"""

from __future__ import annotations

import bisect
import math

from llmfabric.scheduler.perf import Estimate, PerformanceModel
from llmfabric.scheduler.problem import ModelLoad

CAPACITY_STEPS = 8


class RateCurve:
    """Estimates of one (model, GPU type, TP) replica as a function of its arrival rate."""

    def __init__(self, perf: PerformanceModel, load: ModelLoad, gpu_type: str, tp: int,
                 grid: list[float] | None, max_utilization: float = 0.9,
                 capacity_steps: int = CAPACITY_STEPS) -> None:
        """`grid`: the rates to query (interpolating between them); None = query every rate
        exactly. The capacity is located either way (a probe at the model's whole rate)."""
        self._perf, self._load, self._gpu, self._tp = perf, load, gpu_type, tp
        self._exact: dict[float, Estimate] = {}
        self.xs: list[float] = sorted(set(grid)) if grid else []
        self.points: list[Estimate] = [self._query(x) for x in self.xs]
        self.exact = not self.xs
        self.service_rate = math.inf  # req/s one replica completes when overloaded
        self.capacity = math.inf  # req/s the planner lets one replica take
        self._locate_capacity(max_utilization, capacity_steps)

    def _query(self, rate: float) -> Estimate:
        est = self._exact.get(rate)
        if est is None:
            ld = self._load
            est = self._perf.estimate(ld.model, self._gpu, self._tp, rate, ld.mean_in, ld.mean_out)
            self._exact[rate] = est
        return est

    def _overloaded(self, rate: float) -> bool:
        est = self._query(rate)
        return est.saturated or not est.feasible or not math.isfinite(est.mean_e2e_s)

    def _locate_capacity(self, max_utilization: float, steps: int) -> None:
        top = max(self.xs[-1] if self.xs else 0.0, self._load.arrival_rate)
        if top <= 0:
            return
        probe = self._query(top)
        if not probe.feasible:
            self.service_rate = self.capacity = 0.0
        elif not probe.saturated:
            return  # one replica sustains the model's whole load: no kink in range
        else:
            self.service_rate = max(e.throughput_rps for e in self._exact.values()
                                    if e.saturated and e.feasible)
            mu = max_utilization * self.service_rate
            if mu > 0 and self._overloaded(mu):  # the estimator disagrees: bisect below
                lo, hi = 0.0, mu
                for _ in range(steps):
                    mid = hi / 2 if lo <= 0 else math.sqrt(lo * hi)
                    lo, hi = (lo, mid) if self._overloaded(mid) else (mid, hi)
                mu = lo
            self.capacity = mu
        if self.exact:
            return
        # Keep the samples below the capacity and the capacity itself; nothing above is used.
        mu = self.capacity
        keep = [(x, e) for x, e in zip(self.xs, self.points, strict=True) if x < mu]
        if mu > 0:
            keep.append((mu, self._query(mu)))
        self.xs = [x for x, _ in keep]
        self.points = [e for _, e in keep]

    def _served_at(self, rate: float) -> tuple[float, float]:
        """(mean E2E s, throughput req/s) at a rate the replica sustains."""
        if not self.xs or rate <= self.xs[0] or rate >= self.xs[-1]:
            est = self._query(rate)
            return est.mean_e2e_s, min(est.throughput_rps, rate)
        i = bisect.bisect_right(self.xs, rate) - 1
        x0, x1 = math.log(self.xs[i]), math.log(self.xs[i + 1])
        f = (math.log(rate) - x0) / (x1 - x0)
        a, b = self.points[i], self.points[i + 1]
        lat = a.mean_e2e_s + f * (b.mean_e2e_s - a.mean_e2e_s)
        return lat, rate

    def served(self, rate: float) -> tuple[float, float]:
        """(mean E2E s of the served requests, served req/s) when offered `rate`: at most the
        capacity is served, at the latency it has there."""
        if rate <= 0:
            return 0.0, 0.0
        if rate > self.capacity:
            mu = self.capacity
            return (self._served_at(mu)[0], mu) if mu > 0 else (math.inf, 0.0)
        return self._served_at(rate)

    def cost(self, rate: float, penalty_s: float) -> tuple[float, float]:
        """(latency-seconds per second h(rate), served req/s): served requests at their
        latency (capped at `penalty_s`), the excess over capacity at `penalty_s` each."""
        lat, served = self.served(rate)
        lat = min(lat, penalty_s) if math.isfinite(lat) else penalty_s
        return served * lat + (rate - served) * penalty_s, served
