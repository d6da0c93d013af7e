"""The one trace schema every loader produces and the recorder writes.

A `TraceRecord` is one request: when it arrived, for which model, how many input and output
tokens it had, its sampling parameters, optionally the hash ids of its input split in blocks of
`block_tokens` tokens (16 as in the OpenTela trace, 512 in Mooncake's), optionally its
end-to-end latency. Timestamps are seconds (Unix seconds when the source has absolute times,
seconds from the start of the trace otherwise).

On disk (JSONL, and the columns of CSV/Parquet written by this package) a record is:

    {"timestamp": 1700000000.25, "model": "m", "input_tokens": 812, "output_tokens": 64,
     "sampling_params": {"temperature": 0.7, "max_tokens": 256},
     "hash_ids": ["9f3c...", ...] | null, "block_tokens": 16, "latency_s": 2.41 | null}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmfabric.traces.errors import TraceFormatError

JSONScalar = str | int | float | bool | None
HashId = int | str

DEFAULT_BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp: float
    model: str
    input_tokens: int
    output_tokens: int
    sampling_params: Mapping[str, JSONScalar] = field(default_factory=dict, hash=False)
    hash_ids: tuple[HashId, ...] | None = None
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    latency_s: float | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "sampling_params": dict(self.sampling_params),
            "hash_ids": None if self.hash_ids is None else list(self.hash_ids),
            "block_tokens": self.block_tokens,
            "latency_s": self.latency_s,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TraceRecord:
        """Build a record from a row in the native schema; raise TraceFormatError if malformed."""
        try:
            hash_ids = row.get("hash_ids")
            sampling = row.get("sampling_params") or {}
            latency = row.get("latency_s")
            return cls(
                timestamp=float(row["timestamp"]),
                model=str(row["model"]),
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                sampling_params=dict(sampling),
                hash_ids=None if hash_ids is None else tuple(hash_ids),
                block_tokens=int(row.get("block_tokens") or DEFAULT_BLOCK_TOKENS),
                latency_s=None if latency is None else float(latency),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(
                f"row does not match the llmfabric trace schema ({exc!r}); expected keys "
                "timestamp, model, input_tokens, output_tokens"
            ) from exc


# A model is taken as a reasoning model when its name contains one of these substrings or one
# of its dash/slash/dot-separated parts is one of the tokens (lower-case). Used to split
# latency CDFs when the trace has no explicit flag.
REASONING_SUBSTRINGS: tuple[str, ...] = ("thinking", "reason")
REASONING_TOKENS: frozenset[str] = frozenset({"r1", "qwq", "o1", "o3", "o4", "gpt-oss", "oss"})


def is_reasoning_model(model: str) -> bool:
    """Heuristic: does the model name look like a reasoning model (DeepSeek-R1, *-Thinking, ...)?"""
    name = model.lower()
    if any(sub in name for sub in REASONING_SUBSTRINGS):
        return True
    return any(part in REASONING_TOKENS for part in re.split(r"[^a-z0-9]+", name))
