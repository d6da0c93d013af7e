"""The stored Files and Batches, and their OpenAI JSON shapes (`object: "file"` /
`"batch"`). Times are Unix seconds (integers, as OpenAI's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A batch's states (OpenAI's): validating -> in_progress -> finalizing -> completed, or
# failed (bad input), expired (past its window), cancelling -> cancelled.
VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)  # the runner still owes work
# The timestamp field each state sets when it is entered.
STAMPS = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at",
          COMPLETED: "completed_at", FAILED: "failed_at", EXPIRED: "expired_at",
          CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of a batch's lines answered successfully (OpenAI's batch `usage`): cached
    tokens are part of the input, reasoning tokens part of the output."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + self.output_tokens}


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str  # "file-<hex>", ours (never a client's): also its name on disk
    owner: str  # "" without accounts
    filename: str  # the client's name, reduced to a base name (shown only)
    purpose: str
    bytes: int
    created_at: int
    lines: int
    expires_at: int | None = None  # not found from then on (retention.py); None: never

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None,
                "expires_at": self.expires_at}


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str  # "batch_<hex>"
    owner: str
    key_id: str  # the API key the lines run as ("" without accounts)
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, str] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_expires_after: int | None = None  # seconds its output/error files are kept
    usage: Usage = Usage()

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": ({"object": "list", "data": list(self.errors)} if self.errors
                       else None),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window, "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at, "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at, "failed_at": self.failed_at,
            "expired_at": self.expired_at, "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed,
                               "failed": self.failed},
            "metadata": self.metadata, "usage": self.usage.to_json(),
        }
