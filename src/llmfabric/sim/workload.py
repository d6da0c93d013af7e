"""Workloads: request arrival times with input/output token counts.

Generators are seeded and return a `Workload` (numpy arrays sorted by arrival):
- `poisson(rate, duration, ...)`: exponential inter-arrival times;
- `gamma(rate, cv, duration, ...)`: Gamma inter-arrivals with coefficient of variation `cv`
  (cv > 1 is burstier than Poisson);
- `on_off(rate_on, on_s, off_s, duration, ...)`: Poisson bursts separated by silences;
- `replay(rows)`: a list of (time_s, input_tokens, output_tokens);
- `load_trace(path)`: a trace file, read by `llmfabric.traces` (the one parser per format:
  Azure, Mooncake, BurstGPT, llmfabric) or in the simulator's own seconds format (`time_s`);
- `with_prefixes(wl, groups, skew, seed)`: tag requests with shared-prefix groups (Zipf
  popularity) for the prefix-aware routers.
Lengths are an int (fixed) or a sequence of ints sampled uniformly (an empirical distribution).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import WorkloadError, naming_file, not_utf8

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Lengths = int | Sequence[int] | IntArray


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    prefix_id: IntArray | None = None  # shared-prompt-prefix group per request (routers)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.input_tokens) != n or len(self.output_tokens) != n:
            raise WorkloadError("arrival_s, input_tokens and output_tokens differ in length")
        if self.prefix_id is not None and len(self.prefix_id) != n:
            raise WorkloadError("prefix_id needs one entry per request")
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
        return Workload(self.arrival_s[mask], self.input_tokens[mask], self.output_tokens[mask],
                        None if self.prefix_id is None else self.prefix_id[mask])


def with_prefixes(workload: Workload, groups: int, skew: float = 1.0,
                  seed: int = 0) -> Workload:
    """The same requests, each tagged with one of `groups` shared-prefix groups (system
    prompts, conversations) drawn with Zipf popularity p(k) ~ 1/(k+1)^skew (0: uniform)."""
    if groups < 1 or skew < 0:
        raise WorkloadError("with_prefixes needs groups >= 1 and skew >= 0")
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, groups + 1, dtype=np.float64) ** skew
    ids = rng.choice(groups, size=len(workload), p=p / p.sum()).astype(np.int64)
    return Workload(workload.arrival_s, workload.input_tokens, workload.output_tokens, ids)


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


MAX_TRACE_TOKENS = 10**7  # a request's input or output length in a replayed trace
MAX_TRACE_SPAN_S = 1e9  # from the first arrival to the last


def replay(rows: Iterable[tuple[float, int, int]]) -> Workload:
    """A workload from (time_s, input_tokens, output_tokens) rows (any order; shifted so the
    first request arrives at 0, so negative times are fine; inf/NaN are refused)."""
    data: list[tuple[float, int, int]] = []
    for k, (t, i, o) in enumerate(rows, start=1):
        try:
            row = (float(t), int(i), int(o))
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(inf)
            raise WorkloadError(f"row {k}: ({t!r}, {i!r}, {o!r}) is not (time, tokens, "
                                f"tokens): {exc}") from exc
        # an inf time shifts every other one to -inf (or NaN), a NaN one breaks the sort
        if not math.isfinite(row[0]):
            raise WorkloadError(f"row {k}: arrival time {t!r} is not a finite number")
        # 10**100 tokens overflowed the int64 cast (a numpy warning, then "every request
        # needs >= 1 input and >= 1 output token")
        if not (row[1] <= MAX_TRACE_TOKENS and row[2] <= MAX_TRACE_TOKENS):
            raise WorkloadError(f"row {k}: at most {MAX_TRACE_TOKENS} input and output "
                                f"tokens, got ({str(i)[:24]}, {str(o)[:24]})")
        data.append(row)
    data.sort()
    if not data:
        return Workload(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    # a time of 1e308 among 0s was replayed as a run of 1e308 s (one request, then nothing)
    if data[-1][0] - data[0][0] > MAX_TRACE_SPAN_S:
        raise WorkloadError(f"the arrival times span {data[-1][0] - data[0][0]:.3g} s, more "
                            f"than {MAX_TRACE_SPAN_S:.0e} s (about 30 years): give seconds")
    arr = np.array(data, dtype=np.float64)
    times = arr[:, 0] - arr[0, 0]
    return Workload(times, arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64))


# The simulator's own replay format: the time column says its unit (seconds).
SIM_TIME_KEYS = ("time_s", "arrival_s")
_SIM_IN_KEYS = ("input_tokens", "prompt_tokens", "input")
_SIM_OUT_KEYS = ("output_tokens", "completion_tokens", "output")
SIM_FORMAT = "sim"


def _pick(row: dict[str, object], keys: Sequence[str], path: Path) -> tuple[str, object]:
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return key, row[key]
    raise WorkloadError(f"{path}: a row lacks one of the columns {list(keys)}")


def _read_rows(p: Path) -> list[dict[str, object]]:
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        rows: list[dict[str, object]] = [json.loads(line) for line in p.read_text().splitlines()
                                         if line.strip()]
        return rows
    with p.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _columns(p: Path) -> set[str]:
    """Column names of a CSV header or of the first JSONL object."""
    with p.open(newline="") as fh:
        if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            for line in fh:
                if line.strip():
                    first = json.loads(line)
                    return set(first) if isinstance(first, dict) else set()
            return set()
        return set(next(csv.reader(fh), []))


def _sim_number(row: dict[str, object], keys: Sequence[str], p: Path, k: int, *,
                non_negative: bool) -> float:
    """The row's finite number under the first of `keys` it has."""
    name, raw = _pick(row, keys, p)
    try:
        value = float(str(raw))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (non_negative and value < 0):
        bound = " >= 0" if non_negative else ""
        raise WorkloadError(f"{p}: row {k}: {name} must be a finite number{bound}, got {raw!r}")
    return value


def _sim_rows(p: Path, limit: int | None) -> list[tuple[float, int, int]]:
    out: list[tuple[float, int, int]] = []
    for k, r in enumerate(_read_rows(p)[:limit], start=1):  # data rows, from 1
        if not isinstance(r, dict):
            raise WorkloadError(f"{p}: row {k} is not a JSON object")
        # times may be negative (replay shifts them to start at 0); a negative length is
        # nonsense, not a zero to clamp to 1
        out.append((_sim_number(r, SIM_TIME_KEYS, p, k, non_negative=False),
                    int(_sim_number(r, _SIM_IN_KEYS, p, k, non_negative=True)),
                    int(_sim_number(r, _SIM_OUT_KEYS, p, k, non_negative=True))))
    return out


def _trace_rows(p: Path, fmt: str, limit: int | None) -> list[tuple[float, int, int]]:
    """Rows through `llmfabric.traces` (one parser per format; units decided by the format)."""
    from llmfabric.traces import TraceError, iter_records

    rows: list[tuple[float, int, int]] = []
    try:
        # `model` fills traces without a model column; the simulator ignores it
        for rec in iter_records(p, fmt, model="trace"):
            if limit is not None and len(rows) >= limit:
                break
            rows.append((rec.timestamp, rec.input_tokens, rec.output_tokens))
    except TraceError as exc:
        raise WorkloadError(f"{naming_file(p, str(exc))}; or use the simulator's format: "
                            f"columns {SIM_TIME_KEYS[0]} (seconds), input_tokens, "
                            "output_tokens") from exc
    except ImportError as exc:  # CSV/Parquet traces are read with pyarrow
        raise WorkloadError(f"reading {p} needs pyarrow: pip install 'llmfabric[traces]' "
                            f"({exc})") from exc
    return rows


def load_trace(path: str | Path, limit: int | None = None, fmt: str = "auto") -> Workload:
    """Read a trace of `limit` requests at most (default all). Formats (`fmt`, "auto" detects
    from the columns, once per file):
    - "sim": the simulator's own replay format, CSV or JSONL with columns `time_s` (or
      `arrival_s`), seconds, `input_tokens`, `output_tokens`;
    - every format `llmfabric.traces` reads (Azure 2023/2024 with ISO dates, Mooncake JSONL
      with `timestamp` in ms, BurstGPT, the llmfabric/Swiss AI schema); the time unit is the
      format's, never guessed per row.
    Arrivals are shifted so the first request arrives at 0; zero output lengths are clamped to
    1 and zero input lengths to 1."""
    p = Path(path)
    if limit is not None and limit < 0:
        raise WorkloadError("limit must be >= 0")
    try:
        if fmt == "auto":
            fmt = SIM_FORMAT if _columns(p) & set(SIM_TIME_KEYS) else "auto"
        rows = _sim_rows(p, limit) if fmt == SIM_FORMAT else _trace_rows(p, fmt, limit)
        # (inside: replay's errors, e.g. a row's tokens out of range, name the file too)
        return replay((t, max(1, i), max(1, o)) for t, i, o in rows)
    except UnicodeDecodeError as exc:  # (was Python's "'utf-8' codec can't decode byte ...")
        raise WorkloadError(f"cannot read trace {p}: {not_utf8(exc)}; a trace is CSV or JSONL "
                            "text, or Parquet") from None
    except (OSError, ValueError) as exc:
        raise WorkloadError(naming_file(p, str(exc), "cannot read trace ")) from exc
