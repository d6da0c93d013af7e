"""What one ingress's Batch API accepts: `BatchLimits` (file, line and per-owner caps, the
runner's concurrency), the endpoints a batch may target and OpenAI's metadata limits."""

from __future__ import annotations

from dataclasses import dataclass

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
