"""Workload characterization (OpenTela §6.2) computed in one streaming pass over a trace.

`TraceAnalyzer.add(records)` accumulates per-model counters chunk by chunk; `finish()` returns a
`Characterization` of plain numbers. Definitions (each checked by hand in the tests):

- token usage tiers: models ranked by input+output tokens; tier 1 is the smallest set of top
  models holding >= 50% of all tokens, tier 2 the next models up to >= 90%, tier 3 the rest.
- burstiness: tokens (input+output) per minute (TPM), minute = floor(timestamp / 60). The
  model's mean TPM is taken over its active minutes (minutes with >= 1 request); instantaneous
  burstiness = TPM / mean TPM; `burstiness_peak` = its maximum. `request_burstiness_peak` is the
  same with requests per minute.
- length percentiles: numpy's default (linear interpolation) P50/P95/P99 of per-request input
  and output token counts.
- output-token ratio over time: sum(output) / sum(input + output) per time bin of `bin_s`
  seconds (bins aligned on the trace's first timestamp).
- prefix reuse: a request's input is its hash ids (one per block of `block_tokens`); a block
  is reused when the same id was seen for the same model within the last `history_s` seconds.
  Tokens are weighted (every block holds `block_tokens` tokens except the last, which holds the
  remainder of `input_tokens`); the model's `prefix_reuse_ratio` = reused tokens / hashed
  tokens over its lifetime, and the lifetime series bins it by time since its first request.
- latency: P50/P95/P99 of end-to-end latency, per model and split reasoning / non-reasoning
  (`schema.is_reasoning_model`), when the trace has latencies.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmfabric.traces.schema import HashId, TraceRecord, is_reasoning_model

PERCENTILES = (50, 95, 99)
TIER_CUTS = (0.5, 0.9)


def percentiles(values: Iterable[float]) -> dict[str, float] | None:
    data = np.fromiter(values, dtype=np.float64)
    if data.size == 0:
        return None
    return {f"p{p}": float(np.percentile(data, p)) for p in PERCENTILES}


@dataclass(slots=True)
class _ModelStats:
    requests: int = 0
    input_sum: int = 0
    output_sum: int = 0
    first_ts: float = float("inf")
    input_lens: array[int] = field(default_factory=lambda: array("q"))
    output_lens: array[int] = field(default_factory=lambda: array("q"))
    latencies: array[float] = field(default_factory=lambda: array("d"))
    minute_tokens: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    minute_requests: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    # minute since the trace's first record -> [output tokens, input + output tokens]
    ratio_bins: dict[int, list[int]] = field(default_factory=dict)
    history: dict[HashId, float] = field(default_factory=dict)
    hashed_tokens: int = 0
    reused_tokens: int = 0
    # minute since the model's first record -> [reused tokens, hashed tokens]
    reuse_bins: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Characterization:
    """The numbers behind every figure; `to_json()` gives plain JSON-able dicts."""

    models: dict[str, dict[str, Any]]
    tiers: list[dict[str, Any]]
    lengths: dict[str, Any]
    burstiness_timelines: dict[str, list[tuple[float, float]]]
    output_ratio: dict[str, list[tuple[float, float]]]
    prefix_reuse: dict[str, list[tuple[float, float]]]
    latency: dict[str, Any] | None
    trace: dict[str, Any]


_AUTO_BINS = (60.0, 300.0, 900.0, 3_600.0, 21_600.0, 86_400.0, 604_800.0)


def auto_bin(span_s: float, max_bins: int = 100) -> float:
    """The smallest of 1 min, 5 min, 15 min, 1 h, 6 h, 1 day, 1 week giving <= max_bins bins."""
    for size in _AUTO_BINS:
        if span_s / size <= max_bins:
            return size
    return _AUTO_BINS[-1]


def _timeline(
    minute_tokens: dict[int, int], first_minute: int, mean_tpm: float
) -> list[tuple[float, float]]:
    """(hours since first_minute, TPM / mean TPM) for the active minutes, with a 0 point at
    each edge of an idle gap so a line drawn through the points drops to 0 while idle
    (and the series stays at most three times the active minutes long)."""
    points: list[tuple[float, float]] = []
    prev: int | None = None
    for m, tok in sorted(minute_tokens.items()):
        if prev is not None and m - prev > 1:
            points.append(((prev + 1 - first_minute) / 60.0, 0.0))
            if m - prev > 2:
                points.append(((m - 1 - first_minute) / 60.0, 0.0))
        points.append(((m - first_minute) / 60.0, tok / mean_tpm))
        prev = m
    return points


def _rebin(per_minute: dict[int, list[int]], bin_s: float) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for minute, (a, b) in per_minute.items():
        cell = out[int(minute * 60 // bin_s)]
        cell[0] += a
        cell[1] += b
    return out


def _ratio_series(bins: dict[int, list[int]], bin_s: float) -> list[tuple[float, float]]:
    """(bin start in seconds, a / b) for every bin with b > 0, in time order."""
    return [(b * bin_s, num / den) for b, (num, den) in sorted(bins.items()) if den]


class TraceAnalyzer:
    """Streaming accumulator for the characterization; feed chunks in timestamp order."""

    def __init__(
        self,
        *,
        bin_s: float | None = None,
        history_s: float = 3_600.0,
        timeline_models: int = 4,
    ) -> None:
        if (bin_s is not None and bin_s < 60) or history_s <= 0:
            raise ValueError("bin_s must be at least 60 s (or None for auto); history_s positive")
        self.bin_s = bin_s
        self.history_s = history_s
        self.timeline_models = timeline_models
        self._stats: dict[str, _ModelStats] = {}
        self._t0: float | None = None
        self._t_last: float | None = None
        self._records = 0
        self._since_prune = 0

    def add(self, records: Iterable[TraceRecord]) -> None:
        for rec in records:
            self._add_one(rec)

    def _add_one(self, rec: TraceRecord) -> None:
        self._records += 1
        ts = rec.timestamp
        if self._t0 is None:
            self._t0 = ts
        self._t_last = ts if self._t_last is None else max(self._t_last, ts)
        s = self._stats.get(rec.model)
        if s is None:
            s = self._stats[rec.model] = _ModelStats()
        s.requests += 1
        s.input_sum += rec.input_tokens
        s.output_sum += rec.output_tokens
        s.first_ts = min(s.first_ts, ts)
        s.input_lens.append(rec.input_tokens)
        s.output_lens.append(rec.output_tokens)
        if rec.latency_s is not None:
            s.latencies.append(rec.latency_s)
        minute = int(ts // 60)
        s.minute_tokens[minute] += rec.input_tokens + rec.output_tokens
        s.minute_requests[minute] += 1
        b = int((ts - self._t0) // 60)
        cell = s.ratio_bins.setdefault(b, [0, 0])
        cell[0] += rec.output_tokens
        cell[1] += rec.input_tokens + rec.output_tokens
        if rec.hash_ids:
            self._reuse(s, rec)

    def _reuse(self, s: _ModelStats, rec: TraceRecord) -> None:
        ids = rec.hash_ids or ()
        n = len(ids)
        block = rec.block_tokens
        last = rec.input_tokens - (n - 1) * block
        if not 1 <= last <= block:
            last = block
        horizon = rec.timestamp - self.history_s
        reused = hashed = 0
        for i, hid in enumerate(ids):
            size = last if i == n - 1 else block
            hashed += size
            seen = s.history.get(hid)
            if seen is not None and seen >= horizon:
                reused += size
        for hid in ids:
            s.history[hid] = rec.timestamp
        s.hashed_tokens += hashed
        s.reused_tokens += reused
        b = int((rec.timestamp - s.first_ts) // 60)
        cell = s.reuse_bins.setdefault(b, [0, 0])
        cell[0] += reused
        cell[1] += hashed
        self._since_prune += 1
        if self._since_prune >= 50_000:
            self._since_prune = 0
            for stats in self._stats.values():
                stats.history = {k: v for k, v in stats.history.items() if v >= horizon}

    def finish(self) -> Characterization:
        models: dict[str, dict[str, Any]] = {}
        total_tokens = sum(s.input_sum + s.output_sum for s in self._stats.values())
        ranked = sorted(
            self._stats.items(), key=lambda kv: (-(kv[1].input_sum + kv[1].output_sum), kv[0])
        )
        tiers: list[dict[str, Any]] = []
        cumulative = 0
        tier = 1
        for rank, (name, s) in enumerate(ranked, start=1):
            tokens = s.input_sum + s.output_sum
            share = tokens / total_tokens if total_tokens else 0.0
            tiers.append(
                {
                    "rank": rank,
                    "model": name,
                    "tokens": tokens,
                    "input_tokens": s.input_sum,
                    "output_tokens": s.output_sum,
                    "share": share,
                    "tier": tier,
                }
            )
            cumulative += tokens
            frac = cumulative / total_tokens if total_tokens else 1.0
            while tier <= len(TIER_CUTS) and frac >= TIER_CUTS[tier - 1]:
                tier += 1
        tier_of = {t["model"]: t["tier"] for t in tiers}

        timelines: dict[str, list[tuple[float, float]]] = {}
        by_requests = sorted(self._stats, key=lambda m: (-self._stats[m].requests, m))
        for name, s in self._stats.items():
            mean_tpm = sum(s.minute_tokens.values()) / len(s.minute_tokens)
            mean_rpm = sum(s.minute_requests.values()) / len(s.minute_requests)
            peak = max(s.minute_tokens.values()) / mean_tpm if mean_tpm > 0 else None
            rpeak = max(s.minute_requests.values()) / mean_rpm
            first_minute = min(s.minute_tokens)
            if name in by_requests[: self.timeline_models] and mean_tpm > 0:
                timelines[name] = _timeline(s.minute_tokens, first_minute, mean_tpm)
            reuse = s.reused_tokens / s.hashed_tokens if s.hashed_tokens else None
            lat = percentiles(s.latencies) if len(s.latencies) else None
            models[name] = {
                "requests": s.requests,
                "input_tokens": percentiles(s.input_lens),
                "output_tokens": percentiles(s.output_lens),
                "burstiness_peak": peak,
                "prefix_reuse_ratio": reuse,
                "request_burstiness_peak": rpeak,
                "total_input_tokens": s.input_sum,
                "total_output_tokens": s.output_sum,
                "active_minutes": len(s.minute_tokens),
                "mean_tpm_active": mean_tpm,
                "tier": tier_of[name],
                "reasoning": is_reasoning_model(name),
                "latency_s": lat,
            }

        all_in = (
            np.concatenate([np.asarray(s.input_lens) for s in self._stats.values()])
            if self._stats
            else np.array([])
        )
        all_out = (
            np.concatenate([np.asarray(s.output_lens) for s in self._stats.values()])
            if self._stats
            else np.array([])
        )
        lengths: dict[str, Any] = {
            "aggregate": {
                "input_tokens": percentiles(all_in),
                "output_tokens": percentiles(all_out),
            },
            "cdf_models": by_requests[: self.timeline_models],
        }

        span = (self._t_last or 0.0) - (self._t0 or 0.0)
        bin_s = self.bin_s if self.bin_s is not None else auto_bin(span)
        ratio: dict[str, list[tuple[float, float]]] = {}
        totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for name, s in self._stats.items():
            per_bin = _rebin(s.ratio_bins, bin_s)
            for b, (out, tot) in per_bin.items():
                totals[b][0] += out
                totals[b][1] += tot
            if name in by_requests[: self.timeline_models]:
                ratio[name] = _ratio_series(per_bin, bin_s)
        ratio["(all)"] = _ratio_series(totals, bin_s)

        reuse_series = {
            name: _ratio_series(_rebin(s.reuse_bins, bin_s), bin_s)
            for name, s in self._stats.items()
            if s.hashed_tokens
        }

        latency: dict[str, Any] | None = None
        reasoning = [
            v for n, s in self._stats.items() if is_reasoning_model(n) for v in s.latencies
        ]
        plain = [
            v for n, s in self._stats.items() if not is_reasoning_model(n) for v in s.latencies
        ]
        if reasoning or plain:
            latency = {
                "reasoning": percentiles(reasoning),
                "non_reasoning": percentiles(plain),
                "reasoning_requests": len(reasoning),
                "non_reasoning_requests": len(plain),
            }
        trace = {
            "records": self._records,
            "models": len(self._stats),
            "first_timestamp": self._t0,
            "last_timestamp": self._t_last,
            "total_tokens": total_tokens,
            "bin_s": bin_s,
            "history_s": self.history_s,
        }
        return Characterization(
            models=models,
            tiers=tiers,
            lengths=lengths,
            burstiness_timelines=timelines,
            output_ratio=ratio,
            prefix_reuse=reuse_series,
            latency=latency,
            trace=trace,
        )

    def samples(
        self, model: str
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Raw (input lengths, output lengths, latencies) of one model, for CDF plots."""
        s = self._stats[model]
        return np.asarray(s.input_lens), np.asarray(s.output_lens), np.asarray(s.latencies)

    def latency_samples(self, reasoning: bool) -> np.ndarray[Any, Any]:
        values = [
            v
            for n, s in self._stats.items()
            if is_reasoning_model(n) == reasoning
            for v in s.latencies
        ]
        return np.asarray(values, dtype=np.float64)
