"""In-flight request tracking for draining and load hints.

The node calls `begin()`/`end()` (or `with tracker.track():`) around every request it
forwards to its engine. On SIGTERM it calls `close()` (new requests get Draining -> 503, the
ingress retries elsewhere) and `await drained(timeout)` before stopping the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from llmfabric.agent.errors import Draining
from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.registry.records import LoadHints


class InflightTracker:
    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._n = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = True
        self.total = 0

    @property
    def inflight(self) -> int:
        return self._n

    @property
    def accepting(self) -> bool:
        return self._accepting

    def begin(self) -> None:
        """Count a new request; raises Draining once `close()` was called."""
        if not self._accepting:
            raise Draining("this node is draining; retry on another node")
        self._n += 1
        self.total += 1
        self._idle.clear()

    def end(self) -> None:
        if self._n <= 0:
            return
        self._n -= 1
        if self._n == 0:
            self._idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    def close(self) -> None:
        """Stop taking new requests (the ones in flight continue)."""
        self._accepting = False

    async def drained(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight; False if `timeout_s` passed first."""
        if self._n == 0:
            return True
        try:
            await with_timeout(self._clock, self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def load_hints(self, tokens_per_s: float = 0.0) -> LoadHints:
        return LoadHints(inflight=self._n, queued=0, tokens_per_s=tokens_per_s)
