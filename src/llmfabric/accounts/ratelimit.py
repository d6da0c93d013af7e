"""Per-key rate limits: requests/min and tokens/min, as token buckets on an injected clock.

Each limited key has two buckets holding at most one minute's allowance and refilling at
limit/60 per second. `check()` (before a request) takes one request token and refuses while
the token bucket is empty; `hold()` (once the request is read: tenancy/gate.py)
takes the request's worst case (prompt bound + completion cap, at most one minute's
allowance) from the token bucket, refusing while it is empty, and `release()` gives it back
when the request ends; `add_tokens()` (when usage is known) takes the tokens used. Usage
may drive the bucket negative: the key then waits until it refills. With holds, requests in
flight together take at most the bucket plus the last one admitted (and each one's use past
its hold), however many arrive at once; before, all of a burst passed while the bucket was
positive and were charged after.
An owner with aggregate limits (`ApiKey.owner_*`) has the same two buckets, shared by all its
keys (keyed "owner:<name>"), checked together with the key's. State is in memory, per
ingress process.
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


# What one request holds in the token buckets: (bucket name, bucket, tokens) per bucket.
TokenHold = list[tuple[str, _Bucket, float]]


class RateLimiter:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self._token_limit: dict[str, int] = {}
        self._owner_of: dict[str, str] = {}  # key id -> its owner's bucket name

    def check(self, key: ApiKey) -> None:
        """Admit one request of `key` or raise RateLimited(retry_after_s)."""
        if (key.requests_per_min is None and key.tokens_per_min is None
                and key.owner_requests_per_min is None and key.owner_tokens_per_min is None):
            # Unlimited (the common case: one test per request). Limits it had before go
            # with their buckets.
            if key.id in self._owner_of:
                owner = self._owner_of.pop(key.id)
                for name in (key.id, owner):
                    self._requests.pop(name, None)
                    self._tokens.pop(name, None)
                    self._token_limit.pop(name, None)
            return
        now = self._clock.now()
        owner = "owner:" + key.owner
        self._owner_of[key.id] = owner
        self._check_tokens(key.id, key.tokens_per_min, now, "")
        self._check_tokens(owner, key.owner_tokens_per_min, now, f" for owner {key.owner!r}")
        self._check_requests(key.id, key.requests_per_min, now, "")
        self._check_requests(owner, key.owner_requests_per_min, now, f" for owner {key.owner!r}")
        for name, rpm in ((key.id, key.requests_per_min), (owner, key.owner_requests_per_min)):
            if rpm is not None:
                self._requests[name].level -= 1.0  # both passed: take one from each

    def _check_tokens(self, name: str, tpm: int | None, now: float, what: str) -> None:
        if tpm is None:
            self._token_limit.pop(name, None)
            self._tokens.pop(name, None)
            return
        self._token_limit[name] = tpm
        tb = self._tokens.setdefault(name, _Bucket(float(tpm), now))
        tb.refill(now, tpm)
        if tb.level <= 0.0:
            raise RateLimited((1.0 - tb.level) * 60.0 / tpm, f"{tpm} tokens/min{what}")

    def _check_requests(self, name: str, rpm: int | None, now: float, what: str) -> None:
        if rpm is None:
            self._requests.pop(name, None)
            return
        rb = self._requests.setdefault(name, _Bucket(float(rpm), now))
        rb.refill(now, rpm)
        if rb.level < 1.0:
            raise RateLimited((1.0 - rb.level) * 60.0 / rpm, f"{rpm} requests/min{what}")

    def add_tokens(self, key_id: str, n: int) -> None:
        """Charge `n` tokens (prompt + completion) used by a finished request of `key_id`
        (and of its owner)."""
        owner = self._owner_of.get(key_id)
        if n <= 0 or owner is None:
            return  # (only a key limited at its last check() has buckets: none to charge)
        for name in (key_id, owner):
            tpm = self._token_limit.get(name) if name is not None else None
            bucket = self._tokens.get(name) if name is not None else None
            if tpm is None or bucket is None:
                continue
            bucket.refill(self._clock.now(), tpm)
            bucket.level -= n

    def hold(self, key_id: str, n: int) -> TokenHold | None:
        """Take `n` tokens (a request's worst case; at most one minute's allowance) from the
        token buckets of `key_id` and its owner, or raise RateLimited if one is empty (after
        `check()`: only the buckets it found limited). `release()` gives them back."""
        owner = self._owner_of.get(key_id)
        if n <= 0 or owner is None:
            return None
        now = self._clock.now()
        found = []
        for name in (key_id, owner):
            tpm = self._token_limit.get(name)
            bucket = self._tokens.get(name)
            if tpm is None or bucket is None:
                continue
            bucket.refill(now, tpm)
            if bucket.level <= 0.0:
                what = "" if name == key_id else f" for owner {owner[len('owner:'):]!r}"
                raise RateLimited((1.0 - bucket.level) * 60.0 / tpm, f"{tpm} tokens/min{what}")
            found.append((name, bucket, float(min(n, tpm))))
        for _, bucket, take in found:
            bucket.level -= take
        return found or None

    def release(self, held: TokenHold) -> None:
        """Give back what `hold()` took (the request ended; `add_tokens` charged its use).
        A bucket replaced since (the limit lifted or changed) is left alone."""
        now = self._clock.now()
        for name, bucket, take in held:
            tpm = self._token_limit.get(name)
            if tpm is None or self._tokens.get(name) is not bucket:
                continue
            bucket.refill(now, tpm)
            bucket.level = min(float(tpm), bucket.level + take)

    def forget(self, key_id: str) -> None:
        self._requests.pop(key_id, None)
        self._tokens.pop(key_id, None)
        self._token_limit.pop(key_id, None)
        self._owner_of.pop(key_id, None)
