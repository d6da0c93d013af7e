"""Fleet sizing through Slurm, as data: demand + jobs -> submit / cancel decisions.

Pure (no I/O, no clock reads): `decide(demand_rps, jobs, queue_wait_s, now, state, config)`.
- Needed jobs: ceil(demand / capacity_rps), within [min_jobs, max_jobs].
- Future capacity counts the jobs that will still serve once a job submitted NOW could serve
  (after the queue wait Slurm estimates, `sbatch --test-only`, plus `startup_s`): pending
  jobs, submissions not yet visible in squeue, and running jobs whose drain moment
  (allocation end - signal lead) lies beyond that horizon. A running job that drains sooner
  is replaced now, so the replacement serves before it leaves (pre-launch).
- Below need: submit the difference (at most `max_submit` a round). Above need for `idle_s`
  (hysteresis): cancel the surplus, pending jobs first, then running jobs whose node has no
  request in flight, the one ending soonest first; one cancellation a round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "REQUEUED"})


@dataclass(frozen=True, slots=True)
class JobView:
    """One of our jobs: Slurm's view joined with the fabric's view of its node."""

    job_id: str
    state: str  # squeue state
    end: float | None = None  # allocation end (running jobs)
    serving: bool = False  # its node is SERVING in the fabric
    inflight: int = 0  # requests in flight on its node (load hint)


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    capacity_rps: float
    min_jobs: int = 0
    max_jobs: int = 4
    startup_s: float = 300.0  # from running to SERVING (engine load)
    lead_s: float = 120.0  # the profile's signal lead: the node drains this long before its end
    idle_s: float = 300.0
    max_submit: int = 2  # per round
    visible_after_s: float = 120.0  # a submission missing from squeue counts this long


@dataclass(frozen=True, slots=True)
class CapacityState:
    surplus_since: float | None = None
    submitted: tuple[tuple[str, float], ...] = ()  # (job id, when) of our own submissions


@dataclass(frozen=True, slots=True)
class SubmitJobs:
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class CancelJob:
    job_id: str
    pending: bool  # still queued: a plain scancel; running: graceful (the node drains)
    reason: str


CapacityDecision = SubmitJobs | CancelJob


def needed_jobs(demand_rps: float, config: CapacityConfig) -> int:
    want = math.ceil(max(0.0, demand_rps) / config.capacity_rps - 1e-9)
    return min(config.max_jobs, max(config.min_jobs, want))


def decide(demand_rps: float, jobs: Sequence[JobView], queue_wait_s: float, now: float,
           state: CapacityState, config: CapacityConfig
           ) -> tuple[list[CapacityDecision], CapacityState]:
    active = [j for j in jobs if j.state in ACTIVE]
    visible = {j.job_id for j in jobs}
    unseen = tuple((jid, t) for jid, t in state.submitted
                   if jid not in visible and now - t < config.visible_after_s)
    submitted = tuple((jid, t) for jid, t in state.submitted
                      if jid in visible and any(j.job_id == jid for j in active)) + unseen
    horizon = now + max(0.0, queue_wait_s) + config.startup_s
    pending = [j for j in active if j.state != "RUNNING"]
    running = [j for j in active if j.state == "RUNNING"]
    lasting = [j for j in running if j.end is None or j.end - config.lead_s > horizon]
    expiring = len(running) - len(lasting)
    future = len(lasting) + len(pending) + len(unseen)
    need = needed_jobs(demand_rps, config)
    state = replace(state, submitted=submitted)
    if future < need:
        count = min(need - future, config.max_submit)
        why = (f"demand {demand_rps:.3g} req/s needs {need} job(s) of "
               f"{config.capacity_rps:g} req/s; {future} will serve")
        if expiring:
            why += f" ({expiring} end(s) before a new job could serve: replacing)"
        return [SubmitJobs(count, why)], replace(state, surplus_since=None)
    if future == need:
        return [], replace(state, surplus_since=None)
    if state.surplus_since is None:
        return [], replace(state, surplus_since=now)
    if now - state.surplus_since < config.idle_s:
        return [], state
    reason = (f"demand {demand_rps:.3g} req/s needs {need} job(s); {future} would serve "
              f"for {now - state.surplus_since:.0f} s")
    if pending:
        victim = max(pending, key=lambda j: (len(j.job_id), j.job_id))  # the newest
        return [CancelJob(victim.job_id, True, reason)], replace(state, surplus_since=now)
    idle = [j for j in lasting if j.inflight == 0]
    if not idle:
        return [], state
    victim = min(idle, key=lambda j: j.end if j.end is not None else math.inf)
    return [CancelJob(victim.job_id, False, reason)], replace(state, surplus_since=now)
