"""Arrival processes: when each request of a load run is sent, as offsets from the start.

Every process is an `ArrivalProcess` (`offsets(rng, max_requests, max_duration_s)` -> sorted
offsets in seconds, at most `max_requests` of them, all < `max_duration_s`), registered by name
in `ARRIVALS`:

- `poisson`: exponential gaps at `rate` req/s.
- `gamma`: gamma-distributed gaps with mean 1/rate and shape `burstiness` (as `vllm bench
  serve --burstiness`: 1 is Poisson, < 1 burstier, > 1 more regular).
- `onoff`: Flying Serving §6.1.3 bursts: alternating low phases (rate drawn uniformly in
  `low_rate`, default 2-5 req/s, lasting `low_s`) and high phases (`high_rate`, default 10-30
  req/s, lasting `high_s`), Poisson within a phase.
- `replay` (`Replay(timestamps, time_scale)`): the trace's own arrival times relative to its
  first request, multiplied by `time_scale` (0.5 replays twice as fast).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llmfabric.bench.errors import BenchConfigError


class ArrivalProcess(Protocol):
    def offsets(
        self, rng: random.Random, max_requests: int, max_duration_s: float
    ) -> list[float]: ...


def _check_bounds(max_requests: int, max_duration_s: float) -> None:
    if max_requests < 1 or not max_duration_s > 0:
        raise BenchConfigError(
            "a load run needs a positive request count and a positive duration bound"
        )


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise BenchConfigError(f"poisson rate must be > 0 req/s, got {self.rate}")

    def offsets(self, rng: random.Random, max_requests: int, max_duration_s: float) -> list[float]:
        return Gamma(self.rate, 1.0).offsets(rng, max_requests, max_duration_s)


@dataclass(frozen=True, slots=True)
class Gamma:
    rate: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.burstiness > 0:
            raise BenchConfigError("gamma arrivals need rate > 0 and burstiness (shape) > 0")

    def offsets(self, rng: random.Random, max_requests: int, max_duration_s: float) -> list[float]:
        _check_bounds(max_requests, max_duration_s)
        theta = 1.0 / (self.rate * self.burstiness)
        out: list[float] = []
        t = 0.0
        while len(out) < max_requests:
            t += rng.gammavariate(self.burstiness, theta)
            if t >= max_duration_s:
                break
            out.append(t)
        return out


@dataclass(frozen=True, slots=True)
class OnOff:
    low_rate: tuple[float, float] = (2.0, 5.0)
    high_rate: tuple[float, float] = (10.0, 30.0)
    low_s: float = 10.0
    high_s: float = 5.0

    def __post_init__(self) -> None:
        for lo, hi in (self.low_rate, self.high_rate):
            if not 0 < lo <= hi:
                raise BenchConfigError(f"on/off rate range ({lo}, {hi}) must satisfy 0 < lo <= hi")
        if not self.low_s > 0 or not self.high_s > 0:
            raise BenchConfigError("on/off phase durations must be > 0 s")

    def phases(self, rng: random.Random, horizon_s: float) -> list[tuple[float, float, float]]:
        """(start, end, rate) of each phase up to horizon_s, starting with a low phase."""
        out: list[tuple[float, float, float]] = []
        t, high = 0.0, False
        while t < horizon_s:
            lo, hi = self.high_rate if high else self.low_rate
            length = self.high_s if high else self.low_s
            out.append((t, min(t + length, horizon_s), rng.uniform(lo, hi)))
            t += length
            high = not high
        return out

    def offsets(self, rng: random.Random, max_requests: int, max_duration_s: float) -> list[float]:
        _check_bounds(max_requests, max_duration_s)
        out: list[float] = []
        for start, end, rate in self.phases(rng, max_duration_s):
            t = start
            while True:
                t += rng.expovariate(rate)
                if t >= end or len(out) >= max_requests:
                    break
                out.append(t)
            if len(out) >= max_requests:
                break
        return out


@dataclass(frozen=True, slots=True)
class Replay:
    timestamps: Sequence[float]
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise BenchConfigError("replay time_scale must be > 0 (0.5 = twice as fast)")

    def offsets(self, rng: random.Random, max_requests: int, max_duration_s: float) -> list[float]:
        _check_bounds(max_requests, max_duration_s)
        if not self.timestamps:
            return []
        t0 = min(self.timestamps)
        out: list[float] = []
        for ts in sorted(self.timestamps):
            offset = (ts - t0) * self.time_scale
            if offset >= max_duration_s or len(out) >= max_requests:
                break
            out.append(offset)
        return out


ARRIVALS: dict[str, type[Poisson] | type[Gamma] | type[OnOff]] = {
    "poisson": Poisson,
    "gamma": Gamma,
    "onoff": OnOff,
}
