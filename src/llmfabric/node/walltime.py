"""Walltime: the node drains `lead_s` before its allocation ends, and keeps the published end
current (an operator may extend a Slurm job's time limit).

Slurm's `--signal=B:TERM@lead` normally starts the drain (it may come up to a minute early);
this watch is the node's own guarantee when the signal is late, missing (a profile without
it) or the time limit changed (re-read every 5 minutes: one scontrol RPC per job, gentle on
slurmctld). Times are Unix seconds on the injected clock's `wall()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from llmfabric.clock import Clock
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class WalltimeWatch:
    def __init__(self, clock: Clock, end: float, lead_s: float, *,
                 drain: Callable[[], Awaitable[None]],
                 republish: Callable[[float], None],
                 refresh: Callable[[], float | None] | None = None,
                 refresh_s: float = 300.0) -> None:
        self.clock = clock
        self.end = end
        self.lead_s = lead_s
        self._drain = drain
        self._republish = republish
        self._refresh = refresh
        self.refresh_s = refresh_s

    @property
    def drain_at(self) -> float:
        return self.end - self.lead_s

    async def run(self) -> None:
        while True:
            remaining = self.drain_at - self.clock.wall()
            if remaining <= 0:
                log.warning("the allocation ends in %.0f s: draining and leaving",
                            self.end - self.clock.wall())
                await self._drain()
                return
            if self._refresh is None:
                await self.clock.sleep(remaining)
                continue
            await self.clock.sleep(min(remaining, self.refresh_s))
            new = await asyncio.to_thread(self._refresh)
            if new is not None and abs(new - self.end) >= 1.0:
                log.info("the allocation end moved by %+.0f s", new - self.end)
                self.end = new
                self._republish(new)
