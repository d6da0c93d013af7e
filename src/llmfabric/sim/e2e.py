"""Replay measured end-to-end serving rows with the simulator: the one replay method.

A row is one benchmark run: model, GPU, backend (engine), precision and GEMM quantization, TP,
input/output lengths (ISL/OSL), a fixed number of concurrent clients, and the measured mean
TTFT and TPOT in ms (the columns of `serving_e2e_calibration.csv`, docs/simulator.md). Each
row is predicted by `simulate_closed_loop` at the row's concurrency with the row's engine
profile for `waves` x concurrency requests; the prediction is the STEADY-STATE mean (first
wave excluded), as a benchmark of many requests per client reports it, averaged over `runs`
closed loops with independent client drift (seeds `seed` .. `seed + runs - 1`): how clients
cluster is chaotic (one seed's steady TTFT can be off the mean of many by tens of percent at
the same set-up), and a fit against one seed fits that seed's clusters, not the engine.
`replay` returns `{"rows": [...], "summary": {"all": {n, ttft_mape, tpot_mape, ttft_floor,
tpot_floor}, "by_gpu": {...}, "by_backend": {...}}}` (MAPE in percent); rows the simulator
cannot run (unknown GPU or model, does not fit) carry an `error` and are left out of the MAPE.
The floors (`monotone_floor`) are what the measurements alone cost: the lowest MAPE any
prediction could reach on those rows that never falls as the concurrency rises within a
set-up, as a closed loop's steady-state TTFT and TPOT should not.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfabric.sim.closedloop import simulate_closed_loop
from llmfabric.sim.e2e_correction import ResidualCorrection
from llmfabric.sim.errors import SimError, SpecError, not_utf8
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.profiles import EngineProfile, get_profile

COLUMNS = ("model", "gpu", "backend", "backend_version", "precision", "gemm_quant", "tp",
           "isl", "osl", "concurrency", "ttft_ms", "tpot_ms")
# One set-up: rows equal in these and differing in the concurrency form one load curve.
SET_UP = COLUMNS[:9]
DEFAULT_WAVES = 8
DEFAULT_RUNS = 4
# Upper bounds of a row: far above any real benchmark, low enough that a typo cannot make the
# simulator run out of memory (a row simulates `waves` x concurrency requests; 1e7 clients
# took over 4 GB): no replica spans more than 1024 GPUs; 10M tokens is past every context
# window; 100k clients x 8 waves x 4 runs is ~100 MB and a few minutes on one core.
MAX_TP = 1024
MAX_TOKENS = 10**7
MAX_CONCURRENCY = 100_000


@dataclass(frozen=True, slots=True)
class E2ERow:
    model: str
    gpu: str
    backend: str
    backend_version: str
    precision: str
    gemm_quant: str
    tp: int
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float


def _positive_int(raw: str, name: str, line: int, maximum: int) -> int:
    try:
        value = int(float(raw))
    except (ValueError, OverflowError) as exc:  # OverflowError: inf
        raise SpecError(f"row {line}: {name} must be an integer, got {raw!r}") from exc
    if value < 1 or value != float(raw):
        raise SpecError(f"row {line}: {name} must be a positive integer, got {raw!r}")
    if value > maximum:
        raise SpecError(f"row {line}: {name} must be <= {maximum}, got {raw!r}")
    return value


def _measured(raw: str, name: str, line: int) -> float:
    if raw.strip() == "":
        return math.nan  # a row to predict, without a measurement
    try:
        value = float(raw)
    except ValueError as exc:
        raise SpecError(f"row {line}: {name} must be a number, got {raw!r}") from exc
    if not (value > 0 and math.isfinite(value)):
        raise SpecError(f"row {line}: {name} must be > 0 ms, got {raw!r}")
    return value


def read_rows(path: str | Path) -> list[E2ERow]:
    """Rows of a CSV with the calibration file's columns (extra columns are ignored)."""
    try:
        with Path(path).open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise SpecError(f"{path}: missing columns {missing}; need {list(COLUMNS)}")
            out = []
            for line, r in enumerate(reader, start=2):
                short = [c for c in COLUMNS if r[c] is None]  # DictReader's fill of a short row
                if short:
                    raise SpecError(f"row {line} has too few cells: no {', '.join(short)}")
                out.append(E2ERow(
                    r["model"].strip(), r["gpu"].strip(), r["backend"].strip().lower(),
                    r["backend_version"].strip(), r["precision"].strip().lower(),
                    r["gemm_quant"].strip().lower(),
                    _positive_int(r["tp"], "tp", line, MAX_TP),
                    _positive_int(r["isl"], "isl", line, MAX_TOKENS),
                    _positive_int(r["osl"], "osl", line, MAX_TOKENS),
                    _positive_int(r["concurrency"], "concurrency", line, MAX_CONCURRENCY),
                    _measured(r["ttft_ms"], "ttft_ms", line),
                    _measured(r["tpot_ms"], "tpot_ms", line)))
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path} is not a CSV file: {not_utf8(exc)}") from None
    except csv.Error as exc:
        raise SpecError(f"{path}: not a valid CSV ({exc})") from exc
    return out


def model_for(row: E2ERow) -> ModelSpec:
    """The row's model with its quantization: `gemm_quant` fp8 = FP8 weights, FP8 GEMMs and
    FP8 KV cache; nvfp4 = 4-bit weights, FP4 GEMMs and FP8 KV (the NVIDIA ModelOpt
    checkpoints these runs serve quantize the KV cache to FP8); empty = BF16."""
    base = get_model(row.model)
    quant = row.gemm_quant or row.precision
    if quant in ("", "bf16", "fp16", "bfloat16", "float16"):
        return base
    if quant in ("fp8", "fp8_block", "w8a8"):
        return base.with_quantization(weight_bits=8, kv_bits=8, gemm_bits=8)
    if quant in ("nvfp4", "fp4", "mxfp4", "w4a4"):
        return base.with_quantization(weight_bits=4, kv_bits=8, gemm_bits=4)
    raise SpecError(f"unknown quantization {quant!r}; known: fp8, nvfp4 or empty (bf16)")


def predict(row: E2ERow, *, waves: int = DEFAULT_WAVES, seed: int = 0,
            profile: EngineProfile | None = None, runs: int = 1) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of the row's set-up: steady-state means of a closed loop, averaged
    over `runs` loops with seeds `seed`, `seed + 1`, ..."""
    if runs < 1:
        raise SpecError("runs must be >= 1")
    model, gpu = model_for(row), get_gpu(row.gpu)
    prof = profile or get_profile(row.backend)
    ttft = tpot = 0.0
    for k in range(runs):
        res = simulate_closed_loop(model, gpu, row.tp, row.concurrency,
                                   waves * row.concurrency, row.isl, row.osl,
                                   engine_profile=prof, seed=seed + k)
        ttft += res.steady_ttft_s
        tpot += res.steady_tpot_s
    return ttft / runs * 1e3, tpot / runs * 1e3


def _ape(pred: float, meas: float) -> float:
    return abs(pred / meas - 1.0) * 100.0


def monotone_floor(records: Iterable[Mapping[str, Any]], metric: str) -> float:
    """The lowest MAPE (percent) on `records` of `metric` ("ttft_ms" or "tpot_ms") that any
    prediction can reach which never falls as the concurrency rises within a set-up (`SET_UP`
    equal; rows of one concurrency share one prediction). More clients in a closed loop never
    shorten the steady-state queue nor the batch, so a simulator's error on these rows is at
    least this: the part the measurements' own disorder forces on it. Rows without a
    measurement are left out; nan when none is left."""
    curves: dict[tuple[Any, ...], dict[int, list[float]]] = {}
    n = 0
    for r in records:
        measured = float(r[metric])
        if math.isnan(measured):
            continue
        curve = curves.setdefault(tuple(r[c] for c in SET_UP), {})
        curve.setdefault(int(r["concurrency"]), []).append(measured)
        n += 1
    if not n:
        return math.nan
    return 100.0 * sum(_isotonic_cost(curve) for curve in curves.values()) / n


def flat_floor(records: Iterable[Mapping[str, Any]], metric: str, column: str) -> float:
    """The lowest MAPE (percent) on `records` of `metric` that any prediction can reach which
    does not depend on `column` (a `SET_UP` column, e.g. "osl"): rows equal in every other
    set-up column and in the concurrency share one prediction, at best their weighted median.
    With "osl": what a simulator loses whose TTFT is the same for every output length, as the
    fit rows' is (docs/simulator.md "Fifth pass"). Rows without a measurement are left out;
    nan when none is left."""
    if column not in SET_UP:
        raise SpecError(f"flat_floor: {column!r} is not one of {list(SET_UP)}")
    rest = tuple(c for c in (*SET_UP, "concurrency") if c != column)
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in records:
        measured = float(r[metric])
        if not math.isnan(measured):
            groups.setdefault(tuple(r[c] for c in rest), []).append(measured)
    n = sum(len(ms) for ms in groups.values())
    if not n:
        return math.nan
    # (a relative-L1 optimum takes a measured value: the least over them)
    cost = sum(min(sum(abs(v / m - 1.0) for m in ms) for v in ms) for ms in groups.values())
    return 100.0 * cost / n


def _isotonic_cost(curve: Mapping[int, Sequence[float]]) -> float:
    """min over non-decreasing p (one per concurrency) of sum |p / m - 1| over the measured m:
    weighted L1 isotonic regression, whose optimum takes measured values only; dynamic
    programming over (concurrency, value), `best[j]`: the least cost so far with the last
    prediction at `values[j]`."""
    values = sorted({m for ms in curve.values() for m in ms})
    best = [0.0] * len(values)
    for concurrency in sorted(curve):
        measured = curve[concurrency]
        lowest = math.inf
        for j, v in enumerate(values):
            lowest = min(lowest, best[j])  # any earlier prediction <= v may precede v
            best[j] = lowest + sum(abs(v / m - 1.0) for m in measured)
    return min(best)


def summarize(records: Sequence[dict[str, Any]], *, floors: bool = False) -> dict[str, Any]:
    """MAPE (percent) of the records that have a prediction and a measurement: all, by GPU,
    by backend; `floors`: with each block's `monotone_floor` of TTFT and TPOT (the records
    then carry every column of a row)."""
    def block(recs: Iterable[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in recs if "error" not in r and not math.isnan(r["ttft_ms"])
              and not math.isnan(r["pred_ttft_ms"]) and not math.isnan(r["pred_tpot_ms"])]
        n = len(ok)
        out = {"n": n,
               "ttft_mape": sum(_ape(r["pred_ttft_ms"], r["ttft_ms"]) for r in ok) / n
               if n else math.nan,
               "tpot_mape": sum(_ape(r["pred_tpot_ms"], r["tpot_ms"]) for r in ok) / n
               if n else math.nan}
        if floors:
            out["ttft_floor"] = monotone_floor(ok, "ttft_ms")
            out["tpot_floor"] = monotone_floor(ok, "tpot_ms")
        return out

    by_gpu = {g: block(r for r in records if r["gpu"] == g)
              for g in sorted({r["gpu"] for r in records})}
    by_backend = {b: block(r for r in records if r["backend"] == b)
                  for b in sorted({r["backend"] for r in records})}
    return {"all": block(records), "by_gpu": by_gpu, "by_backend": by_backend}


def replay(rows: str | Path | Sequence[E2ERow], *, waves: int = DEFAULT_WAVES, seed: int = 0,
           profiles: dict[str, EngineProfile] | None = None,
           runs: int = DEFAULT_RUNS,
           correction: ResidualCorrection | None = None) -> dict[str, Any]:
    """Predict every row; see the module docstring for the JSON shape. `profiles` replaces
    the engine profile of a backend (fitting); `runs` closed loops per row are averaged;
    `correction` (`e2e_correction`, fitted on other rows) scales the analytic predictions,
    which each row then keeps as `analytic_ttft_ms`/`analytic_tpot_ms`."""
    if waves < 2:
        raise SpecError("waves must be >= 2 (the first wave is excluded from the steady state)")
    if runs < 1:
        raise SpecError("runs must be >= 1")
    table = read_rows(rows) if isinstance(rows, (str, Path)) else list(rows)
    records: list[dict[str, Any]] = []
    for row in table:
        rec: dict[str, Any] = {c: getattr(row, c) for c in COLUMNS}
        try:
            prof = (profiles or {}).get(row.backend) or get_profile(row.backend)
            rec["pred_ttft_ms"], rec["pred_tpot_ms"] = predict(row, waves=waves, seed=seed,
                                                               profile=prof, runs=runs)
        except SimError as exc:
            rec["pred_ttft_ms"] = rec["pred_tpot_ms"] = math.nan
            rec["error"] = str(exc)
        records.append(rec)
    if correction is not None:
        records = correction.apply(records)
    return {"rows": records, "summary": summarize(records, floors=True)}
