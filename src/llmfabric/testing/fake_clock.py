"""Virtual time for asyncio code that sleeps through a Clock.

Tests call `await clock.advance(seconds)`: timers fire in deadline order and every task that
becomes runnable gets to run before time moves on, so minutes of protocol run in milliseconds.
`FakeClock(resolution=r)` (r > 0, for large simulations) fires every timer due within r
seconds of the earliest one together, in deadline order, and lets the tasks run once after
the batch; a timer then fires up to r early. The default 0 fires one timer at a time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class FakeClock:
    def __init__(
        self, start: float = 0.0, wall_start: float = 1_700_000_000.0, *, resolution: float = 0.0
    ) -> None:
        if resolution < 0:
            raise ValueError("resolution must be >= 0 seconds")
        self.resolution = resolution
        self._now = start
        self._wall_offset = wall_start - start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._now + max(0.0, seconds), next(self._seq), fut))
        await fut

    @property
    def pending_timers(self) -> int:
        return sum(1 for _, _, f in self._timers if not f.done())

    async def settle(self) -> None:
        """Let every runnable task run until the loop has nothing ready (timers excluded)."""
        loop = asyncio.get_running_loop()
        idle_rounds = 0
        # The loop's ready queue is private; fall back to a fixed number of yields without it.
        ready = getattr(loop, "_ready", None)
        for _ in range(10_000):
            await asyncio.sleep(0)
            if ready is not None and len(ready) == 0:
                idle_rounds += 1
                if idle_rounds >= 3:
                    return
            elif ready is None:
                idle_rounds += 1
                if idle_rounds >= 50:
                    return
            else:
                idle_rounds = 0

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing due timers in order."""
        target = self._now + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._timers)
            if fut.done():
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)
            if self.resolution:
                end = min(target, self._now + self.resolution)
                while self._timers and self._timers[0][0] <= end:
                    _, _, due = heapq.heappop(self._timers)
                    if not due.done():
                        due.set_result(None)
            await self.settle()
        self._now = target
        await self.settle()

    async def run_until(
        self, predicate: Callable[[], bool], within: float, step: float = 0.01
    ) -> bool:
        """Advance in `step`s until `predicate()` is true or `within` virtual seconds pass."""
        end = self._now + within
        while self._now < end:
            if predicate():
                return True
            await self.advance(step)
        return bool(predicate())
