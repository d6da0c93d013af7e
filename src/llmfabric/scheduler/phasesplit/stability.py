"""Queue stability of a plan: its replicas' predicted utilisation against a stated headroom
(analytic, from the same cost model as the routing LP), and a growing-queue detector on a
simulated trace (the final-plan simulation).

Why: the analytic attainment averages over queueing episodes (Little's-law batch, Erlang-C
seat wait). A decode replica loaded to 85 % of its TPOT-bound tokens/s meets the SLO on
average but, after a burst fills its KV, preempts and recomputes: its real throughput drops
below the demand and the seat queue grows without bound (benchmarks.md, "ThunderServe T7
stability"). Both checks here are blind to that mechanism's details on purpose: a headroom on
utilisation is what a serving engineer provisions, and a queue that grows shows in the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.scheduler.errors import SpecError
from llmfabric.sim.results import SLO

Array = npt.NDArray[np.float64]
# The default stated headroom: no replica of a plan loaded past 80 % of its capacity (prefill:
# busy time per second; decode: token demand over the TPOT-bound tokens/s).
HEADROOM = 0.8


def overload_share(lam: Array, rho: Array, headroom: float, rate: float) -> float:
    """The share of all requests that replicas receive beyond `headroom` of their capacity:
    a replica at utilisation rho > h gets lam (1 - h / rho) requests/s too many (all of
    them when it has no capacity). Summed over replicas (a request may count in both phases),
    capped at 1. Zero when every replica is within the headroom."""
    if not 0 < headroom <= 1 or not rate > 0:
        raise SpecError("headroom in (0, 1] and rate > 0")
    lam_v, rho_v = np.asarray(lam, dtype=np.float64), np.asarray(rho, dtype=np.float64)
    over = rho_v > headroom
    # lam (rho - h) / rho: positive whenever rho > h (1 - h / rho can round to 0)
    finite = np.isfinite(rho_v)
    r = np.where(over & finite, rho_v, 1.0)
    share = np.where(finite, (r - headroom) / r, 1.0)
    excess = np.where(over, lam_v * share, 0.0)
    return min(1.0, float(excess.sum()) / rate)


@dataclass(frozen=True, slots=True)
class QueueTrend:
    """First half vs second half (by arrival) of a simulated window."""

    first_attainment: float
    second_attainment: float
    first_stretch: float  # mean SLO stretch: a request's worst latency / its deadline
    second_stretch: float
    growing: bool

    @property
    def attainment(self) -> float:
        """The later half's attainment: what the plan serves once its queues have had time
        to build (the whole window's average hides a collapse near its end)."""
        return self.second_attainment


# a half differs by chance (Poisson bursts) by a few standard errors; a growing queue also
# stretches latency: both must hold
TREND_SIGMAS = 3.0
TREND_MIN_DROP = 0.02
TREND_STRETCH = 1.25


def queue_trend(
    arrival_s: Array, ttft_s: Array, tpot_s: Array, e2e_s: Array, slo: SLO, window_s: float
) -> QueueTrend:
    """Growing-queue detector. Requests are split at window_s / 2 by arrival. The queue is
    growing when the second half's SLO attainment is lower than the first's by more than
    max(TREND_MIN_DROP, TREND_SIGMAS standard errors of the difference) AND its mean SLO
    stretch (max over the SLO's deadlines of latency / deadline) is TREND_STRETCH x the
    first's. A stable system at high load has bursts that cost attainment in either half;
    only a queue that builds makes the later half both worse and slower. Rejected or
    unfinished requests (NaN latency) count as missed and as stretch 2 x the deadline."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    if not window_s > 0 or not len(arr) == len(ttft_s) == len(tpot_s) == len(e2e_s):
        raise SpecError("window_s > 0 and per-request arrays of one length")
    stretch = _stretch(
        np.asarray(ttft_s, dtype=np.float64),
        np.asarray(tpot_s, np.float64),
        np.asarray(e2e_s, dtype=np.float64),
        slo,
    )
    ok = stretch <= 1.0
    first, second = arr < window_s / 2, arr >= window_s / 2
    n1, n2 = int(first.sum()), int(second.sum())
    if n1 == 0 or n2 == 0:
        nan = float("nan")
        return QueueTrend(nan, nan, nan, nan, False)
    p1, p2 = float(ok[first].mean()), float(ok[second].mean())
    s1, s2 = float(stretch[first].mean()), float(stretch[second].mean())
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n1 + 1 / n2))
    growing = p1 - p2 > max(TREND_MIN_DROP, TREND_SIGMAS * se) and s2 >= TREND_STRETCH * s1
    return QueueTrend(p1, p2, s1, s2, growing)


def _stretch(ttft: Array, tpot: Array, e2e: Array, slo: SLO) -> Array:
    """Per request, max over the SLO's deadlines of latency / deadline (e2e / median e2e
    without any deadline). TPOT is NaN for one-token outputs: it does not count then; an
    unfinished request (e2e NaN) counts as 2, a miss, as in sim.results.attainment."""
    parts = []
    for value, deadline, nan_is_miss in (
        (ttft, slo.ttft_s, True),
        (tpot, slo.tpot_s, False),
        (e2e, slo.e2e_s, True),
    ):
        if deadline is None:
            continue
        r = value / deadline
        parts.append(np.where(np.isnan(r), 2.0 if nan_is_miss else 0.0, r))
    if not parts:
        ref = float(np.nanmedian(e2e)) if np.any(np.isfinite(e2e)) else 1.0
        parts.append(np.where(np.isnan(e2e), 2.0, e2e / max(ref, 1e-12) / 2))
    worst = np.max(np.vstack(parts), axis=0)
    out: Array = np.where(np.isnan(e2e), np.maximum(worst, 2.0), worst)  # unfinished: missed
    return out
