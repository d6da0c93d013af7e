"""Per-format row adapters: turn one row of a known trace format into a TraceRecord.

Formats (names accepted by `load.iter_batches(fmt=...)`):
- `llmfabric` / `swissai`: this package's schema (see `schema`), which follows the OpenTela /
  Swiss AI serving trace (timestamp, model, input/output token counts, sampling parameters,
  16-token bucket hash ids). Column aliases are accepted (`prompt_tokens`, `completion_tokens`,
  `model_id`, `created_at`, `latency_ms`, sampling parameters as one `sampling_params` dict or
  JSON string, or as separate `temperature`/`top_p`/`max_tokens`/... columns). Numeric
  timestamps above 1e11 are taken as Unix milliseconds.
- `burstgpt`: BurstGPT CSV (`Timestamp` seconds from start, `Model`, `Request tokens`,
  `Response tokens`, `Total tokens`, `Log Type`).
- `azure2023`, `azure2024`: Azure LLM inference traces (`TIMESTAMP` date-time, `ContextTokens`,
  `GeneratedTokens`); the model is the file's stem unless given.
- `mooncake`: Mooncake JSONL (`timestamp` in ms, `input_length`, `output_length`, `hash_ids`
  one per 512-token block); the model is the file's stem unless given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from llmfabric.traces.errors import TraceFormatError, UnknownTraceFormatError
from llmfabric.traces.schema import DEFAULT_BLOCK_TOKENS, HashId, JSONScalar, TraceRecord

MOONCAKE_BLOCK_TOKENS = 512

Adapter = Callable[[Mapping[str, Any]], TraceRecord]

_TIMESTAMP_KEYS = ("timestamp", "time", "created_at", "created", "request_time", "arrival_time")
_MODEL_KEYS = ("model", "model_id", "model_name")
_INPUT_KEYS = ("input_tokens", "prompt_tokens", "input_length", "num_input_tokens")
_OUTPUT_KEYS = ("output_tokens", "completion_tokens", "output_length", "num_output_tokens")
_SAMPLING_COLUMNS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "n",
    "stream",
)


def parse_timestamp(value: Any) -> float:
    """Seconds from a number (already seconds) or an ISO-8601 string (naive means UTC)."""
    if isinstance(value, bool):
        raise TraceFormatError(f"timestamp {value!r} is a boolean; expected seconds or ISO-8601")
    if isinstance(value, int | float):
        return _finite_timestamp(float(value), value)
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            return _finite_timestamp(number, value)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as exc:
            raise TraceFormatError(
                f"timestamp {value!r} is neither seconds nor ISO-8601 date-time"
            ) from exc
    else:
        raise TraceFormatError(f"timestamp {value!r} has unsupported type {type(value).__name__}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _finite_timestamp(number: float, raw: Any) -> float:
    # inf/NaN would poison every time bin (and int() of them raises far from the row)
    if not math.isfinite(number):
        raise TraceFormatError(f"timestamp {raw!r} is not a finite number")
    return number


# Numbers above this are Unix milliseconds (1e11 s is year 5138; 1e11 ms is 1973).
_MS_THRESHOLD = 1e11


def _seconds(value: float) -> float:
    return value / 1000.0 if value > _MS_THRESHOLD else value


def _first(row: Mapping[str, Any], keys: tuple[str, ...], what: str) -> Any:
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    # CSV cells like "", "nan" or "NULL" read as null: the column may exist but be empty
    raise TraceFormatError(f"row has no {what} value (empty or missing; columns {', '.join(keys)})")


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        text = value.strip()
        if not text:
            return None
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise TraceFormatError(f"value {value!r} is not valid JSON") from exc
    return value


def _scalar(value: Any) -> JSONScalar:
    """A sampling value; text cells from CSV ("0.7", "true") become numbers/booleans."""
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        if isinstance(parsed, str | int | float | bool):
            return parsed
        return value
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _int(value: Any, what: str, minimum: int = 0) -> int:
    """An integer >= `minimum` (token counts are >= 0); 12.0 is 12, 12.5 and True are not."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise TraceFormatError(f"{what} {value!r} is not an integer")
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{what} {value!r} is not an integer") from exc
    if number < minimum:
        raise TraceFormatError(f"{what} {value!r} must be >= {minimum}")
    return number


def _float(value: Any, what: str, *, non_negative: bool = False) -> float:
    """A finite number (>= 0 with `non_negative`, e.g. a latency)."""
    if isinstance(value, bool):
        raise TraceFormatError(f"{what} {value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{what} {value!r} is not a number") from exc
    if not math.isfinite(number) or (non_negative and number < 0):
        bound = "finite and >= 0" if non_negative else "finite"
        raise TraceFormatError(f"{what} {value!r} must be {bound}")
    return number


def _hash_ids(value: Any) -> tuple[HashId, ...] | None:
    if value is None:
        return None
    # a bare number or string would be iterated (or fail) far from the row that gave it
    if not isinstance(value, list | tuple) or not all(
        isinstance(h, int | str) and not isinstance(h, bool) for h in value
    ):
        raise TraceFormatError(f"hash_ids {value!r:.60} must be a list of integers or strings")
    return tuple(value)


def native_adapter(model: str | None = None) -> Adapter:
    """Adapter for the llmfabric / Swiss AI schema (with aliases); `model` overrides the column."""

    def adapt(row: Mapping[str, Any]) -> TraceRecord:
        sampling_raw = _maybe_json(row.get("sampling_params"))
        sampling: dict[str, JSONScalar] = {}
        if isinstance(sampling_raw, Mapping):
            sampling.update(sampling_raw)
        for key in _SAMPLING_COLUMNS:
            if row.get(key) is not None:
                sampling[key] = _scalar(row[key])
        latency: float | None = None
        if row.get("latency_s") is not None:
            latency = _float(row["latency_s"], "latency_s", non_negative=True)
        elif row.get("latency") is not None:
            latency = _float(row["latency"], "latency", non_negative=True)
        elif row.get("latency_ms") is not None:
            latency = _float(row["latency_ms"], "latency_ms", non_negative=True) / 1000.0
        return TraceRecord(
            timestamp=_seconds(parse_timestamp(_first(row, _TIMESTAMP_KEYS, "timestamp"))),
            model=model or str(_first(row, _MODEL_KEYS, "model")),
            input_tokens=_int(_first(row, _INPUT_KEYS, "input token"), "input tokens"),
            output_tokens=_int(_first(row, _OUTPUT_KEYS, "output token"), "output tokens"),
            sampling_params=sampling,
            hash_ids=_hash_ids(_maybe_json(row.get("hash_ids"))),
            block_tokens=_int(row.get("block_tokens") or DEFAULT_BLOCK_TOKENS, "block_tokens", 1),
            latency_s=latency,
        )

    return adapt


def burstgpt_adapter(model: str | None = None) -> Adapter:
    def adapt(row: Mapping[str, Any]) -> TraceRecord:
        try:
            return TraceRecord(
                timestamp=_float(row["Timestamp"], "Timestamp"),
                model=model or str(row["Model"]),
                input_tokens=_int(row["Request tokens"], "Request tokens"),
                output_tokens=_int(row["Response tokens"], "Response tokens"),
            )
        except KeyError as exc:
            raise TraceFormatError(f"BurstGPT row lacks column {exc}") from exc

    return adapt


def azure_adapter(model: str) -> Adapter:
    def adapt(row: Mapping[str, Any]) -> TraceRecord:
        try:
            return TraceRecord(
                timestamp=parse_timestamp(row["TIMESTAMP"]),
                model=model,
                input_tokens=_int(row["ContextTokens"], "ContextTokens"),
                output_tokens=_int(row["GeneratedTokens"], "GeneratedTokens"),
            )
        except KeyError as exc:
            raise TraceFormatError(f"Azure trace row lacks column {exc}") from exc

    return adapt


def mooncake_adapter(model: str) -> Adapter:
    def adapt(row: Mapping[str, Any]) -> TraceRecord:
        try:
            return TraceRecord(
                timestamp=_float(row["timestamp"], "timestamp") / 1000.0,
                model=str(row.get("model") or model),
                input_tokens=_int(row["input_length"], "input_length"),
                output_tokens=_int(row["output_length"], "output_length"),
                hash_ids=_hash_ids(row.get("hash_ids")),
                block_tokens=MOONCAKE_BLOCK_TOKENS,
            )
        except KeyError as exc:
            raise TraceFormatError(f"Mooncake row lacks key {exc}") from exc

    return adapt


FORMATS: tuple[str, ...] = (
    "llmfabric",
    "swissai",
    "burstgpt",
    "azure2023",
    "azure2024",
    "mooncake",
)


def adapter_for(fmt: str, default_model: str, model: str | None) -> Adapter:
    """The adapter of format `fmt`; `model` overrides, `default_model` fills traces without one."""
    if fmt in ("llmfabric", "swissai"):
        return native_adapter(model)
    if fmt == "burstgpt":
        return burstgpt_adapter(model)
    if fmt in ("azure2023", "azure2024"):
        return azure_adapter(model or default_model)
    if fmt == "mooncake":
        return mooncake_adapter(model or default_model)
    raise UnknownTraceFormatError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")


def format_from_columns(columns: list[str], first_row: Mapping[str, Any] | None) -> str:
    """Guess the format from column names (and, for Azure, the first timestamp)."""
    names = set(columns)
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= names:
        stamp = str((first_row or {}).get("TIMESTAMP", ""))
        return "azure2024" if ("+" in stamp[10:] or stamp.endswith("Z")) else "azure2023"
    if {"Request tokens", "Response tokens"} <= names:
        return "burstgpt"
    if {"input_length", "output_length"} <= names and not names & set(_MODEL_KEYS):
        return "mooncake"
    if names & set(_TIMESTAMP_KEYS) and names & set(_INPUT_KEYS) and names & set(_OUTPUT_KEYS):
        return "llmfabric"
    if not names:  # (said "from columns []")
        raise UnknownTraceFormatError("no columns to tell the trace format from (an empty "
                                      "file?)")
    raise UnknownTraceFormatError(
        f"cannot tell the trace format from columns {sorted(names)}; pass the format explicitly "
        f"(--format, or --trace-format where the trace is an input: one of {', '.join(FORMATS)})"
    )
