"""Engine load from its own metrics: running and waiting requests, KV-cache use, prefix hits.

`parse_prometheus(text)` sums each metric over its label sets; `load_from_metrics(fmt, text)`
reads one engine's names:

- vllm: vllm:num_requests_running, vllm:num_requests_waiting, KV vllm:kv_cache_usage_perc
  (older: gpu_cache_usage_perc), prefix vllm:prefix_cache_hits/queries counters (older:
  gpu_prefix_cache_hit_rate);
- sglang: sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage,
  sglang:cache_hit_rate;
- llama.cpp (`llama-server --metrics`): llamacpp:requests_processing,
  llamacpp:requests_deferred, llamacpp:kv_cache_usage_ratio;
- tgi: tgi_batch_current_size, tgi_queue_size.

`load_from_slots(body)` reads llama-server's /slots (running = slots processing) when it runs
without `--metrics`. `PrefixRate` turns cumulative hit/query counters into a recent rate.
Inputs are hostile: malformed lines are skipped, values are clamped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # 0..1
    prefix_hit_rate: float | None = None  # 0..1; None: the engine does not say
    prefix_hits: float | None = None  # cumulative counters (vLLM), for PrefixRate
    prefix_queries: float | None = None


def parse_prometheus(text: str, max_lines: int = 100_000) -> dict[str, float]:
    """metric name -> sum over its samples (comments, bad lines, NaN/inf skipped)."""
    return {name: sum(values) for name, values in parse_samples(text, max_lines).items()}


def parse_samples(text: str, max_lines: int = 100_000) -> dict[str, list[float]]:
    """metric name -> its sample values, one per label set (e.g. one per DP engine)."""
    out: dict[str, list[float]] = {}
    for i, line in enumerate(text.splitlines()):
        if i >= max_lines:
            break
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                continue
            name, rest = line[:brace], line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not name or not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            out.setdefault(name, []).append(value)
    return out


_RATIOS = ("_perc", "_ratio", "_usage", "_hit_rate")


def _count(v: float | None) -> int:
    # (a sum of finite samples can be inf: two label sets at 1e308; round(inf) raised)
    return max(0, min(1_000_000, round(v))) if v is not None and math.isfinite(v) else 0


def _frac(v: float | None) -> float:
    return max(0.0, min(1.0, v)) if v is not None and math.isfinite(v) else 0.0


def _first(m: dict[str, float], *names: str) -> float | None:
    for n in names:
        if n in m:
            return m[n]
    return None


def load_from_metrics(fmt: str, text: str) -> EngineLoad | None:
    """The engine's load from its Prometheus text; None when none of its metrics appear.

    Request counts add up over label sets (data-parallel engines behind one server); ratios
    (KV-cache use, hit rates) are averaged."""
    samples = parse_samples(text)
    m = {name: sum(values) for name, values in samples.items()}
    for name, values in samples.items():
        if name.endswith(_RATIOS):
            m[name] = sum(values) / len(values)
    if fmt == "vllm":
        running = _first(m, "vllm:num_requests_running")
        if running is None:
            return None
        kv = _first(m, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                    "vllm:cpu_cache_usage_perc")
        rate = _first(m, "vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate")
        return EngineLoad(
            _count(running), _count(_first(m, "vllm:num_requests_waiting")), _frac(kv),
            _frac(rate) if rate is not None else None,
            _first(m, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
            _first(m, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
        )
    if fmt == "sglang":
        running = _first(m, "sglang:num_running_reqs")
        if running is None:
            return None
        rate = _first(m, "sglang:cache_hit_rate")
        return EngineLoad(_count(running), _count(_first(m, "sglang:num_queue_reqs")),
                          _frac(_first(m, "sglang:token_usage")),
                          _frac(rate) if rate is not None else None)
    if fmt == "llama.cpp":
        running = _first(m, "llamacpp:requests_processing")
        if running is None:
            return None
        return EngineLoad(_count(running), _count(_first(m, "llamacpp:requests_deferred")),
                          _frac(_first(m, "llamacpp:kv_cache_usage_ratio")))
    if fmt == "tgi":
        running = _first(m, "tgi_batch_current_size")
        waiting = _first(m, "tgi_queue_size")
        if running is None and waiting is None:
            return None
        return EngineLoad(_count(running), _count(waiting))
    return None


def load_from_slots(body: Any) -> EngineLoad | None:
    """llama-server /slots: a list of slots, each `is_processing` (or `state` != 0)."""
    if not isinstance(body, list):
        return None
    busy = 0
    for slot in body[:4096]:
        if not isinstance(slot, dict):
            continue
        if slot.get("is_processing") is True or (
                isinstance(slot.get("state"), int) and slot["state"] != 0):
            busy += 1
    return EngineLoad(running=busy)


class PrefixRate:
    """Recent prefix-cache hit rate from cumulative hit/query counters (vLLM V1)."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def update(self, load: EngineLoad) -> float | None:
        if load.prefix_hit_rate is not None:
            return load.prefix_hit_rate
        if load.prefix_hits is None or load.prefix_queries is None:
            return None
        now = (load.prefix_hits, load.prefix_queries)
        last, self._last = self._last, now
        if last is None or now[1] < last[1]:  # first scrape, or the engine restarted
            return _frac(now[0] / now[1]) if now[1] > 0 else None
        dq = now[1] - last[1]
        return _frac((now[0] - last[0]) / dq) if dq > 0 else None
