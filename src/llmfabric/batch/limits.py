"""What one ingress's Batch API accepts: `BatchLimits` (file, line and per-owner caps, the
runner's concurrency), `batch_limits` (the caps an operator sets, `--batch-limit KEY=VALUE`),
the endpoints a batch may target and OpenAI's metadata limits."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

MIB = 1024 * 1024

# The routes a batch line may call (as OpenAI's Batch API: chat, completions, embeddings).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOWS = {"24h": 24 * 3600.0}  # OpenAI offers 24h only
FILE_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"

# OpenAI's metadata limits: 16 pairs, keys of at most 64 characters, values of 512.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_CUSTOM_ID_CHARS = 512
MAX_FILENAME_CHARS = 255
MAX_REPORTED_ERRORS = 100  # a failed batch's `errors.data` lists at most this many lines


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """Caps of one ingress's Batch API (the composition root sets `max_line_bytes` to the
    ingress's body cap: a line's request is then one the ingress would take live)."""

    max_file_bytes: int = 100 * MIB
    max_lines: int = 50_000
    max_line_bytes: int = 8 * MIB
    max_files_per_owner: int = 100  # files an owner uploaded (batch outputs not counted)
    max_bytes_per_owner: int = 1024 * MIB  # bytes of the files an owner uploaded
    max_active_batches_per_owner: int = 10  # batches not yet completed/failed/...
    max_output_bytes: int = 1024 * MIB  # the answers one batch keeps (output + error file)
    max_output_files_per_owner: int = 1000  # batch outputs kept before a new batch is refused
    concurrency: int = 4  # lines in flight at once, all batches of the ingress together

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_lines", "max_line_bytes", "max_files_per_owner",
                     "max_bytes_per_owner", "max_active_batches_per_owner",
                     "max_output_bytes", "max_output_files_per_owner", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"BatchLimits.{name} must be at least 1")


# The caps `--batch-limit KEY=VALUE` sets (`batch_limits` in a node's config file): every
# field but `max_line_bytes` (always the ingress's body cap) and `concurrency`
# (--batch-concurrency). The byte-valued ones take a size with a unit too (2GiB, 500MB).
LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(BatchLimits)
                   if f.name not in ("max_line_bytes", "concurrency"))
BYTE_KEYS = frozenset(k for k in LIMIT_KEYS if "_bytes" in k)
_SET_ELSEWHERE = {"max_line_bytes": "a line's cap is the ingress's request body cap",
                  "concurrency": "--batch-concurrency sets it"}
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)")


def _limit_value(key: str, raw: object) -> int:
    """`raw` (an int, a whole float, or a string: digits, for a byte cap with a unit) as a
    whole number >= 1; ValueError otherwise."""
    sized = key in BYTE_KEYS
    what = ("a whole number of bytes above 0 (e.g. 2GiB, 500MB, 1048576)" if sized
            else "a whole number above 0 (e.g. 100)")
    number: Decimal | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        number = Decimal(raw)
    elif isinstance(raw, float):
        if math.isfinite(raw):  # (not NaN or an infinity)
            number = Decimal(raw)
    elif isinstance(raw, str):
        match = _SIZE.fullmatch(raw.strip())
        unit = match.group(2).lower() if match else ""
        if match and unit in _UNITS and (sized or not unit):  # (digits: a valid Decimal)
            number = Decimal(match.group(1)) * _UNITS[unit]
    if number is None or number != number.to_integral_value():
        raise ValueError(f"batch limit {key}={raw!r} is not {what}")
    if number < 1:
        raise ValueError(f"batch limit {key}={raw!r} must be at least 1")
    return int(number)


def batch_limits(values: Mapping[str, object], **fixed: int | None) -> BatchLimits:
    """BatchLimits with `values` (`--batch-limit KEY=VALUE`: a LIMIT_KEYS name -> a whole
    number, or a size such as 2GiB for a byte cap) and `fixed` (what the composition root
    sets: `max_line_bytes`, `concurrency`, ...; None: the default) over the defaults.
    ValueError names an unknown key (listing the known ones), a bad value, or a cap set both
    ways."""
    changes: dict[str, int] = {}
    for key, raw in values.items():
        if key in _SET_ELSEWHERE:
            raise ValueError(f"batch limit {key!r} is not a key: {_SET_ELSEWHERE[key]}")
        if key not in LIMIT_KEYS:
            raise ValueError(f"unknown batch limit {key!r} (known: {', '.join(LIMIT_KEYS)})")
        changes[key] = _limit_value(key, raw)
    given = {k: v for k, v in fixed.items() if v is not None}
    for key in given.keys() & changes.keys():
        raise ValueError(f"batch limit {key} is set twice")
    return dataclasses.replace(BatchLimits(), **given, **changes)


def batch_flags_refusal(given: Sequence[str], batch_dir: bool, file_cap_twice: str | None
                        ) -> str | None:
    """Why the batch options `given` (as the operator named them) may not be, or None: they
    go with --batch-dir (they were ignored without it), and the largest input file is set
    one way (`file_cap_twice`: the other option that set it beside `--batch-limit
    max_file_bytes`). One rule for both composition roots' checks."""
    if given and not batch_dir:
        return (f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --batch-dir "
                "(the Batch API is off without it)")
    if file_cap_twice is not None:
        return f"{file_cap_twice} and --batch-limit max_file_bytes set the same cap: give one"
    return None


class BatchOptions(Protocol):
    """What a composition root's settings say of the Batch API (the standalone ingress's
    `Settings`, a node's `NodeConfig`)."""

    @property
    def batch_limits(self) -> Mapping[str, object] | tuple[tuple[str, object], ...]: ...
    @property
    def batch_concurrency(self) -> int: ...
    @property
    def batch_max_file_bytes(self) -> int | None: ...  # (--batch-max-file-mb; None: not set)
    @property
    def max_body_bytes(self) -> int: ...


def limits_of(options: BatchOptions) -> BatchLimits:
    """The BatchLimits a composition root gives its BatchService: the operator's caps, the
    runner's concurrency, and a line's cap at the ingress's body cap (a line's request is
    then one the ingress would take live)."""
    values = options.batch_limits
    return batch_limits(values if isinstance(values, Mapping) else dict(values),
                        max_line_bytes=options.max_body_bytes,
                        concurrency=options.batch_concurrency,
                        max_file_bytes=options.batch_max_file_bytes)
