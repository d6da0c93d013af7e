"""The workload an ingress observes: per-model arrival rate and mean token lengths.

A sliding window (default 5 minutes) of fixed buckets (default 10 s) on the injected clock;
old buckets fall out whole. The rate is the count in the kept buckets over the time they cover
(from the start of the oldest kept bucket to now, at least one bucket), so right after start a
new ingress reports its real load, not a fraction of it. Token means come from the usage the
responses reported; requests without usage (a stream without include_usage) count as arrivals
only. The node publishes `snapshot()` in its registry record (ModelDemand) and the fleet
controller sums it over all ingress nodes (scheduler.observed).
"""

from __future__ import annotations

from collections import deque

from llmfabric.clock import Clock
from llmfabric.registry.records import ModelDemand

MAX_PUBLISHED_MODELS = 32  # busiest models first; keeps the record far below its size cap


class _Tally:
    __slots__ = ("arrivals", "in_sum", "out_sum", "with_usage")

    def __init__(self) -> None:
        self.arrivals = 0
        self.with_usage = 0
        self.in_sum = 0
        self.out_sum = 0


class DemandMeter:
    def __init__(self, clock: Clock, *, window_s: float = 300.0, bucket_s: float = 10.0) -> None:
        if not 0 < bucket_s <= window_s:
            raise ValueError("need 0 < bucket_s <= window_s")
        self.clock = clock
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._started = clock.now()
        self._buckets: deque[tuple[int, dict[str, _Tally]]] = deque()

    def _bucket_index(self) -> int:
        return int((self.clock.now() - self._started) // self.bucket_s)

    @property
    def _keep(self) -> int:
        return max(1, int(self.window_s // self.bucket_s))

    def _expire(self, index: int) -> None:
        while self._buckets and self._buckets[0][0] <= index - self._keep:
            self._buckets.popleft()

    def record(self, model: str, prompt_tokens: int | None, completion_tokens: int | None
               ) -> None:
        """One request for `model` arrived (and finished, with usage when known)."""
        index = self._bucket_index()
        if not self._buckets or self._buckets[-1][0] != index:
            self._expire(index)
            self._buckets.append((index, {}))
        tally = self._buckets[-1][1].get(model)
        if tally is None:
            tally = self._buckets[-1][1][model] = _Tally()
        tally.arrivals += 1
        if prompt_tokens is not None and completion_tokens is not None:
            tally.with_usage += 1
            tally.in_sum += prompt_tokens
            tally.out_sum += completion_tokens

    def snapshot(self) -> tuple[ModelDemand, ...]:
        """Per-model demand over the window, busiest first (at most MAX_PUBLISHED_MODELS)."""
        index = self._bucket_index()
        self._expire(index)
        totals: dict[str, _Tally] = {}
        for _, tallies in self._buckets:
            for model, t in tallies.items():
                acc = totals.setdefault(model, _Tally())
                acc.arrivals += t.arrivals
                acc.with_usage += t.with_usage
                acc.in_sum += t.in_sum
                acc.out_sum += t.out_sum
        oldest = max(0, index - self._keep + 1) * self.bucket_s
        span = max(self.bucket_s, self.clock.now() - self._started - oldest)
        out = [
            ModelDemand(
                model,
                round(t.arrivals / span, 4),
                round(t.in_sum / t.with_usage, 1) if t.with_usage else 0.0,
                round(t.out_sum / t.with_usage, 1) if t.with_usage else 0.0,
            )
            for model, t in totals.items()
        ]
        out.sort(key=lambda d: (-d.rate, d.model))
        return tuple(out[:MAX_PUBLISHED_MODELS])


def moved(old: tuple[ModelDemand, ...], new: tuple[ModelDemand, ...], *,
          relative: float = 0.1, absolute: float = 0.05) -> bool:
    """Whether `new` differs enough from the published `old` to be worth a record update
    (every update is gossiped to the whole fabric)."""
    before = {d.model: d for d in old}
    if set(before) != {d.model for d in new}:
        return True
    for d in new:
        b = before[d.model]
        for x, y in ((b.rate, d.rate), (b.mean_in, d.mean_in), (b.mean_out, d.mean_out)):
            if abs(x - y) > max(absolute, relative * max(abs(x), abs(y))):
                return True
    return False
