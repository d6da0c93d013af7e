"""Serving outcomes: per-request TTFT/TPOT/E2E, throughput, SLO attainment, utilisation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import SpecError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SLO:
    """Deadlines in seconds; None = not constrained. A request attains the SLO if it completes
    and meets every given deadline."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for v in (self.ttft_s, self.tpot_s, self.e2e_s):
            if v is not None and v <= 0:
                raise SpecError("SLO deadlines must be > 0 seconds")

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None


@dataclass(frozen=True, slots=True, eq=False)
class Utilisation:
    """Busy fraction per time bucket, averaged over replicas (and per replica)."""

    bucket_s: float
    start_s: FloatArray  # bucket start times
    busy_fraction: FloatArray  # mean over replicas
    per_replica: npt.NDArray[np.float64]  # shape (replicas, buckets)


@dataclass(frozen=True, slots=True, eq=False)
class ServingResult:
    n_requests: int
    n_completed: int
    n_rejected: int
    duration_s: float
    throughput_rps: float
    output_tokens_per_s: float
    mean_ttft_s: float
    p50_ttft_s: float
    p99_ttft_s: float
    mean_tpot_s: float
    p99_tpot_s: float
    mean_e2e_s: float
    p50_e2e_s: float
    p99_e2e_s: float
    slo_attainment: float  # NaN when no SLO was given
    preemptions: int
    arrival_s: FloatArray
    ttft_s: FloatArray  # NaN for rejected requests
    tpot_s: FloatArray  # NaN for single-token outputs and rejected requests
    e2e_s: FloatArray
    replica: IntArray
    utilisation: Utilisation

    def summary(self) -> dict[str, float]:
        """Scalar fields as a JSON-friendly dict."""
        keys = ("n_requests", "n_completed", "n_rejected", "duration_s", "throughput_rps",
                "output_tokens_per_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s", "mean_tpot_s",
                "p99_tpot_s", "mean_e2e_s", "p50_e2e_s", "p99_e2e_s", "slo_attainment",
                "preemptions")
        return {k: float(getattr(self, k)) for k in keys}


def nan_stat(values: FloatArray, q: float | None = None) -> float:
    """The mean (or the q-th percentile) of the values that are not NaN; NaN if none are."""
    v = values[~np.isnan(values)]
    if v.size == 0:
        return math.nan
    return float(v.mean()) if q is None else float(np.percentile(v, q))


def attainment(ttft: FloatArray, tpot: FloatArray, e2e: FloatArray, slo: SLO) -> float:
    if slo.empty or ttft.size == 0:
        return math.nan
    ok = ~np.isnan(e2e)
    if slo.ttft_s is not None:
        ok &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= np.isnan(tpot) | (tpot <= slo.tpot_s)
    if slo.e2e_s is not None:
        ok &= e2e <= slo.e2e_s
    return float(ok.mean())


def utilisation(busy: Sequence[tuple[Sequence[float], Sequence[float]]], end_s: float,
                bucket_s: float | None = None) -> Utilisation:
    """Busy fraction per bucket from each replica's sorted, disjoint busy intervals."""
    end_s = max(end_s, 1e-9)
    if bucket_s is None:
        bucket_s = end_s / 100.0
    edges = np.arange(0.0, end_s + bucket_s, bucket_s)
    rows = []
    for starts, ends in busy:
        s = np.asarray(starts, dtype=np.float64)
        e = np.asarray(ends, dtype=np.float64)
        if s.size == 0:
            rows.append(np.zeros(len(edges) - 1))
            continue
        dur = np.concatenate([[0.0], np.cumsum(e - s)])
        idx = np.searchsorted(e, edges, side="right")  # intervals fully done before edge
        partial = np.where(idx < s.size, np.clip(edges - s[np.minimum(idx, s.size - 1)], 0, None),
                           0.0)
        cum = dur[idx] + partial
        rows.append(np.diff(cum) / bucket_s)
    per = np.vstack(rows) if rows else np.zeros((0, len(edges) - 1))
    mean = per.mean(axis=0) if len(rows) else np.zeros(len(edges) - 1)
    return Utilisation(bucket_s, edges[:-1], np.clip(mean, 0, 1), np.clip(per, 0, 1))


def build_result(arrival: FloatArray, input_tokens: IntArray, output_tokens: IntArray,
                 first_token: FloatArray, finish: FloatArray, truncated: npt.NDArray[np.bool_],
                 replica: IntArray, preemptions: int, slo: SLO | None,
                 busy: Sequence[tuple[Sequence[float], Sequence[float]]]) -> ServingResult:
    n = arrival.size
    done = ~np.isnan(finish) & ~truncated
    first = np.where(done, first_token, np.nan)
    fin = np.where(done, finish, np.nan)
    ttft = first - arrival
    e2e = fin - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output_tokens > 1, (fin - first) / (output_tokens - 1), np.nan)
    n_done = int(done.sum())
    end = float(np.nanmax(fin)) if n_done else 0.0
    start = float(arrival.min()) if n else 0.0
    span = max(end - start, 1e-12)
    out_tokens = float(output_tokens[done].sum()) if n_done else 0.0
    return ServingResult(
        n_requests=n,
        n_completed=n_done,
        n_rejected=n - n_done,
        duration_s=end - start if n_done else 0.0,
        throughput_rps=n_done / span if n_done else 0.0,
        output_tokens_per_s=out_tokens / span if n_done else 0.0,
        mean_ttft_s=nan_stat(ttft),
        p50_ttft_s=nan_stat(ttft, 50),
        p99_ttft_s=nan_stat(ttft, 99),
        mean_tpot_s=nan_stat(tpot),
        p99_tpot_s=nan_stat(tpot, 99),
        mean_e2e_s=nan_stat(e2e),
        p50_e2e_s=nan_stat(e2e, 50),
        p99_e2e_s=nan_stat(e2e, 99),
        slo_attainment=attainment(ttft, tpot, e2e, slo) if slo is not None else math.nan,
        preemptions=preemptions,
        arrival_s=arrival,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        replica=replica,
        utilisation=utilisation(busy, end),
    )
