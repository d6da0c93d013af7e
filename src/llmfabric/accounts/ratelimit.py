"""Per-key rate limits: requests/min and tokens/min, as token buckets on an injected clock.

Each limited key has two buckets holding at most one minute's allowance and refilling at
limit/60 per second. `check()` (before a request) takes one request token and refuses while
the token bucket is empty; `add_tokens()` (after the response, when usage is known) takes the
tokens used, which may drive the bucket negative: the key then waits until it refills.
State is in memory, per ingress process.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfabric.accounts.errors import RateLimited
from llmfabric.accounts.models import ApiKey
from llmfabric.clock import Clock


@dataclass(slots=True)
class _Bucket:
    level: float
    stamp: float

    def refill(self, now: float, per_min: int) -> None:
        rate = per_min / 60.0
        self.level = min(float(per_min), self.level + (now - self.stamp) * rate)
        self.stamp = now


class RateLimiter:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._token_limit: dict[str, int] = {}

    def check(self, key: ApiKey) -> None:
        """Admit one request of `key` or raise RateLimited(retry_after_s)."""
        now = self._clock.now()
        tpm = key.tokens_per_min
        if tpm is not None:
            self._token_limit[key.id] = tpm
            tb = self._tokens.setdefault(key.id, _Bucket(float(tpm), now))
            tb.refill(now, tpm)
            if tb.level <= 0.0:
                raise RateLimited((1.0 - tb.level) * 60.0 / tpm, f"{tpm} tokens/min")
        else:
            self._token_limit.pop(key.id, None)
            self._tokens.pop(key.id, None)
        rpm = key.requests_per_min
        if rpm is not None:
            rb = self._requests.setdefault(key.id, _Bucket(float(rpm), now))
            rb.refill(now, rpm)
            if rb.level < 1.0:
                raise RateLimited((1.0 - rb.level) * 60.0 / rpm, f"{rpm} requests/min")
            rb.level -= 1.0
        else:
            self._requests.pop(key.id, None)

    def add_tokens(self, key_id: str, n: int) -> None:
        """Charge `n` tokens (prompt + completion) used by a finished request of `key_id`."""
        tpm = self._token_limit.get(key_id)
        bucket = self._tokens.get(key_id)
        if tpm is None or bucket is None or n <= 0:
            return
        bucket.refill(self._clock.now(), tpm)
        bucket.level -= n

    def forget(self, key_id: str) -> None:
        self._requests.pop(key_id, None)
        self._tokens.pop(key_id, None)
        self._token_limit.pop(key_id, None)
