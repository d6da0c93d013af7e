"""Authentication, rate limits and usage for the ingress, backed by llmfabric.accounts.

`AccountsAuth` adapts `AccountStore` (+ `RateLimiter`) to the ingress's Authenticator and
UsageSink protocols. `StaticKeys` is a fixed token table for tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from llmfabric.accounts.errors import RateLimited
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST, clamp_tokens
from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.store import AccountStore
from llmfabric.ingress.protocols import Principal


class AccountsAuth:
    """Authenticator + UsageSink over the accounts package."""

    def __init__(self, store: AccountStore, limiter: RateLimiter | None = None) -> None:
        self._store = store
        self._limiter = limiter
        self._record_usage = store.usage_recorder  # (bound once: this runs per request)
        # A verified key's principal without a coroutine, None: await authenticate().
        self.cached = store.authenticate_cached
        self.expired_at = store.expired_at

    @property
    def limiter(self) -> RateLimiter | None:
        """The keys' rate limits (the tenancy gate holds a request's tokens there)."""
        return self._limiter

    def authenticate(self, token: str) -> Coroutine[Any, Any, ApiKey | None]:
        # The store's coroutine itself: one coroutine frame less per request.
        return self._store.authenticate(token)

    def check_rate(self, principal: Principal) -> float | None:
        if self._limiter is None or not isinstance(principal, ApiKey):
            return None
        try:
            self._limiter.check(principal)
        except RateLimited as e:
            return e.retry_after_s
        return None

    def record(self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
               estimated: bool = False) -> None:
        # The provider's claim, clamped to plausible counts before it is billed or charged
        # (one chained test for the usual in-range ints; bool and float are clamped).
        if not (type(prompt_tokens) is int and type(completion_tokens) is int
                and 0 <= prompt_tokens <= MAX_TOKENS_PER_REQUEST
                and 0 <= completion_tokens <= MAX_TOKENS_PER_REQUEST):
            prompt_tokens, completion_tokens = (clamp_tokens(prompt_tokens),
                                                clamp_tokens(completion_tokens))
        self._record_usage(key_id, model, prompt_tokens, completion_tokens, estimated)
        if self._limiter is not None:
            self._limiter.add_tokens(key_id, prompt_tokens + completion_tokens)


@dataclass(frozen=True, slots=True)
class StaticPrincipal:
    id: str
    record_trace: bool = True
    models: frozenset[str] | None = None


class StaticKeys:
    """A fixed table token -> key id (tests, benchmarks); no rate limits. Records usage in
    memory: `usage[(key_id, model)] = [prompt_tokens, completion_tokens, requests,
    estimated requests]`."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._keys = {t: StaticPrincipal(k) for t, k in tokens.items()}
        self.usage: dict[tuple[str, str], list[int]] = {}

    async def authenticate(self, token: str) -> StaticPrincipal | None:
        return self._keys.get(token)

    def cached(self, token: str) -> StaticPrincipal | None:
        return self._keys.get(token)

    def check_rate(self, principal: Principal) -> float | None:
        return None

    def expired_at(self, token: str) -> float | None:
        return None

    def record(self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
               estimated: bool = False) -> None:
        row = self.usage.setdefault((key_id, model), [0, 0, 0, 0])
        row[0] += prompt_tokens
        row[1] += completion_tokens
        row[2] += 1
        row[3] += int(estimated)
