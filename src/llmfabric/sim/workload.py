"""Workloads: request arrival times with input/output token counts.

Generators are seeded and return a `Workload` (numpy arrays sorted by arrival):
- `poisson(rate, duration, ...)`: exponential inter-arrival times;
- `gamma(rate, cv, duration, ...)`: Gamma inter-arrivals with coefficient of variation `cv`
  (cv > 1 is burstier than Poisson);
- `on_off(rate_on, on_s, off_s, duration, ...)`: Poisson bursts separated by silences;
- `replay(rows)` / `load_trace(path)`: a list of (time_s, input_tokens, output_tokens).
Lengths are an int (fixed) or a sequence of ints sampled uniformly (an empirical distribution).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import WorkloadError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Lengths = int | Sequence[int] | IntArray


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.input_tokens) != n or len(self.output_tokens) != n:
            raise WorkloadError("arrival_s, input_tokens and output_tokens differ in length")
        if n and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise WorkloadError("arrival times must be >= 0 and sorted; use replay() to sort")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise WorkloadError("every request needs >= 1 input and >= 1 output token")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        return len(self) / self.duration_s if len(self) > 1 and self.duration_s > 0 else 0.0

    def mean_input(self) -> float:
        return float(self.input_tokens.mean()) if len(self) else 0.0

    def mean_output(self) -> float:
        return float(self.output_tokens.mean()) if len(self) else 0.0

    def subset(self, mask: npt.NDArray[np.bool_]) -> Workload:
        return Workload(self.arrival_s[mask], self.input_tokens[mask], self.output_tokens[mask])


def _lengths(spec: Lengths, n: int, rng: np.random.Generator) -> IntArray:
    if isinstance(spec, (int, np.integer)):
        if spec < 1:
            raise WorkloadError("token lengths must be >= 1")
        return np.full(n, int(spec), dtype=np.int64)
    values = np.asarray(spec, dtype=np.int64)
    if values.size == 0 or values.min() < 1:
        raise WorkloadError("a length distribution needs >= 1 value, each >= 1")
    return values[rng.integers(0, values.size, size=n)]


def _from_gaps(gaps: FloatArray, duration: float, input_tokens: Lengths, output_tokens: Lengths,
               rng: np.random.Generator) -> Workload:
    times = np.cumsum(gaps)
    times = times[times < duration]
    n = len(times)
    return Workload(times, _lengths(input_tokens, n, rng), _lengths(output_tokens, n, rng))


def _check(rate: float, duration: float) -> None:
    if rate <= 0 or duration <= 0:
        raise WorkloadError("rate and duration must be > 0")


def poisson(rate: float, duration: float, input_tokens: Lengths = 512,
            output_tokens: Lengths = 256, seed: int = 0) -> Workload:
    _check(rate, duration)
    rng = np.random.default_rng(seed)
    n = int(rate * duration * 1.2 + 10 * np.sqrt(rate * duration) + 10)
    return _from_gaps(rng.exponential(1.0 / rate, n), duration, input_tokens, output_tokens, rng)


def gamma(rate: float, cv: float, duration: float, input_tokens: Lengths = 512,
          output_tokens: Lengths = 256, seed: int = 0) -> Workload:
    """Gamma inter-arrivals, mean 1/rate, coefficient of variation `cv` (cv=1: Poisson)."""
    _check(rate, duration)
    if cv <= 0:
        raise WorkloadError("cv must be > 0")
    rng = np.random.default_rng(seed)
    shape = 1.0 / cv**2
    n = int(rate * duration * 1.5 + 20 * np.sqrt(rate * duration) * max(cv, 1.0) + 10)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    while gaps.sum() < duration:
        gaps = np.concatenate([gaps, rng.gamma(shape, 1.0 / (rate * shape), n)])
    return _from_gaps(gaps, duration, input_tokens, output_tokens, rng)


def on_off(rate_on: float, on_s: float, off_s: float, duration: float,
           input_tokens: Lengths = 512, output_tokens: Lengths = 256, seed: int = 0) -> Workload:
    """Poisson arrivals at `rate_on` during `on_s` windows, none during `off_s` windows."""
    _check(rate_on, duration)
    if on_s <= 0 or off_s < 0:
        raise WorkloadError("on_s must be > 0 and off_s >= 0")
    rng = np.random.default_rng(seed)
    base = poisson(rate_on, duration, 1, 1, seed).arrival_s
    period = on_s + off_s
    # compress on-time into the on-windows of the timeline
    k = np.floor(base / on_s)
    times = k * period + (base - k * on_s)
    times = times[times < duration]
    n = len(times)
    return Workload(times, _lengths(input_tokens, n, rng), _lengths(output_tokens, n, rng))


def replay(rows: Iterable[tuple[float, int, int]]) -> Workload:
    """A workload from (time_s, input_tokens, output_tokens) rows (any order; shifted so the
    first request arrives at 0)."""
    data = sorted((float(t), int(i), int(o)) for t, i, o in rows)
    if not data:
        return Workload(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    arr = np.array(data, dtype=np.float64)
    times = arr[:, 0] - arr[0, 0]
    return Workload(times, arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64))


_TIME_KEYS = ("time_s", "timestamp_s", "arrival_s", "time", "timestamp", "TIMESTAMP")
_IN_KEYS = ("input_tokens", "input_length", "ContextTokens", "prompt_tokens", "input")
_OUT_KEYS = ("output_tokens", "output_length", "GeneratedTokens", "completion_tokens", "output")


def _pick(row: dict[str, object], keys: Sequence[str], path: Path) -> object:
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return row[key]
    raise WorkloadError(f"{path}: a row lacks one of the columns {list(keys)}")


def _time_value(raw: object, key_hint: str) -> float:
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        text = str(raw)
        try:
            value = float(text)
        except ValueError:
            micros = np.datetime64(text.replace(" ", "T")[:26]).astype("datetime64[us]")
            return float(micros.astype(np.int64)) / 1e6
    return value / 1000.0 if key_hint == "timestamp" and value > 1e5 else value


def load_trace(path: str | Path, limit: int | None = None) -> Workload:
    """Read a CSV or JSONL trace: columns time (s; `timestamp` in ms as in Mooncake traces, or
    an ISO date as in the Azure trace), input tokens, output tokens. Zero output lengths are
    clamped to 1."""
    p = Path(path)
    try:
        if p.suffix in (".jsonl", ".json"):
            raw_rows: list[dict[str, object]] = [
                json.loads(line) for line in p.read_text().splitlines() if line.strip()
            ]
        else:
            with p.open(newline="") as fh:
                raw_rows = list(csv.DictReader(fh))
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read trace {p}: {exc}") from exc
    if limit is not None:
        raw_rows = raw_rows[:limit]
    rows = []
    for row in raw_rows:
        key = next((k for k in _TIME_KEYS if k in row), "time_s")
        t = _time_value(_pick(row, _TIME_KEYS, p), key)
        i = max(1, int(float(str(_pick(row, _IN_KEYS, p)))))
        o = max(1, int(float(str(_pick(row, _OUT_KEYS, p)))))
        rows.append((t, i, o))
    return replay(rows)
