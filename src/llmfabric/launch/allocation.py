"""When does this node's allocation end? (walltime awareness)

Inside a Slurm job: `SLURM_JOB_END_TIME` (Slurm >= 23.02 sets it), else `scontrol show job`'s
EndTime (older Slurm, and after an operator changed the time limit). Outside a job: an
explicit value (`llmfabric start --alloc-end`) or none. The node publishes the end in its
registry record (NodeMeta.alloc_end) and drains `drain_lead` seconds ahead of it; routing
stops sending it requests that would outlast it (routing/walltime.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from llmfabric.clock import Clock
from llmfabric.launch.errors import SlurmError
from llmfabric.launch.slurm import Runner, Slurm, parse_time, subprocess_runner
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


def slurm_job_id(env: Mapping[str, str]) -> str | None:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return job if job and job.isdigit() else None


def allocation_end(env: Mapping[str, str], runner: Runner | None = None) -> float | None:
    """Unix time the current Slurm allocation ends, or None (not in a job, or no limit)."""
    job = slurm_job_id(env)
    if job is None:
        return None
    raw = env.get("SLURM_JOB_END_TIME", "")
    if raw.isdigit() and int(raw) > 0:
        return float(raw)
    try:
        fields = Slurm(runner or subprocess_runner(timeout=10)).job(job)
    except SlurmError as exc:
        log.warning("cannot read the end of Slurm job %s (scontrol: %s); walltime unknown",
                    job, exc)
        return None
    return parse_time(fields.get("EndTime", ""))


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
