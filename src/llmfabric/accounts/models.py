"""Value types of the accounts package: API keys (never their secret) and usage rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key's public record. The plaintext is shown once at creation and never stored;
    the database keeps only its SHA-256 hash."""

    id: str  # the lookup part of the plaintext, e.g. "k3f9a0c1d2e4b5a6"
    name: str
    owner: str
    admin: bool
    created_at: float  # Unix seconds
    revoked_at: float | None = None
    requests_per_min: int | None = None  # None: unlimited
    tokens_per_min: int | None = None  # None: unlimited
    record_trace: bool = True
    # The owner's aggregate limits (all its keys together; None: unlimited), filled in by the
    # store from its owner-limit table when the key authenticates.
    owner_requests_per_min: int | None = None
    owner_tokens_per_min: int | None = None
    # sha256(plaintext) hex, kept for publishing grants to other ingresses (accounts.grants);
    # never in to_json
    hash: str = ""
    # The ingress that issued a key this one accepts through its grant ("": ours, a row of
    # the api_keys table, through which the ledger knows the key's owner)
    issuer: str = ""
    # Unix seconds after which the key is refused (401 expired_api_key); None: never
    expires_at: float | None = None
    # The model ids the key may use (an alias or LoRA adapter of one of them too); None: all
    models: frozenset[str] | None = None

    @property
    def active(self) -> bool:
        """Not revoked (an expired key is still active: `expired` says whether it is)."""
        return self.revoked_at is None

    def expired(self, now: float) -> bool:
        """Whether the key is past its expiry at `now` (Unix seconds)."""
        return self.expires_at is not None and self.expires_at <= now

    @property
    def prefix(self) -> str:
        """What a listing shows in place of the secret: the public part of the key."""
        return f"lf-{self.id}-..."

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "admin": self.admin,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
            "active": self.active,
            "prefix": self.prefix,
            "requests_per_min": self.requests_per_min,
            "tokens_per_min": self.tokens_per_min,
            "record_trace": self.record_trace,
            "expires_at": self.expires_at,
            "models": None if self.models is None else sorted(self.models),
        }


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Token usage of one key for one model on one UTC day."""

    key_id: str
    owner: str
    model: str
    day: str  # "YYYY-MM-DD" (UTC)
    requests: int
    prompt_tokens: int
    completion_tokens: int
    estimated_requests: int = 0  # of `requests`, those whose tokens the ingress estimated

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "owner": self.owner,
            "model": self.model,
            "day": self.day,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "estimated_requests": self.estimated_requests,
        }
