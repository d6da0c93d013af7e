"""The Slurm launcher: observe (squeue, sbatch --test-only, the fabric's records), decide
(launch/capacity.py, pure), execute (sbatch --parsable, scancel) on an injected clock.

Jobs are ours when their name is the profile's job name (`llmfabric-<name>`). A job's node is
found in the registry by its `slurm_job` label (the sbatch script sets it), and, once the
launcher can read the node key in the job's home, only under that key (launch/jobkeys.py).
Slurm commands block, so observing and executing run in a worker thread; the loop keeps the
node's gossip and membership answering meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import replace

from llmfabric.clock import Clock
from llmfabric.launch.capacity import (
    CancelJob,
    CapacityConfig,
    CapacityDecision,
    CapacityState,
    JobView,
    SubmitJobs,
    decide,
)
from llmfabric.launch.errors import LaunchError, SlurmTimeout
from llmfabric.launch.jobkeys import JobKeys
from llmfabric.launch.profile import SlurmProfile
from llmfabric.launch.sbatch import render_sbatch
from llmfabric.launch.slurm import Slurm
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.launch")

# The id a submission whose sbatch timed out is counted under until squeue shows its job
# (Slurm's job ids are digits).
UNCONFIRMED = "unconfirmed-"


def simulated_capacity_rps(model: str, gpu: str, gpus: int, mean_in: float,
                           mean_out: float) -> float:
    """Requests/s one replica of `model` sustains on `gpus` GPUs of type `gpu` (TP = the
    largest power of two <= gpus): the planner's capacity, 0.9 x the simulated service rate
    (scheduler/curves.py). A few simulator runs: call it once, at start."""
    from llmfabric.scheduler.curves import RateCurve
    from llmfabric.scheduler.errors import SchedulerError
    from llmfabric.scheduler.problem import ModelLoad
    from llmfabric.scheduler.simadapter import SimPerformance

    perf = SimPerformance()
    tp = max(t for t in (1, 2, 4, 8) if t <= max(1, gpus))
    try:
        curve = RateCurve(perf, ModelLoad(model, 1000.0, mean_in, mean_out),
                          perf.gpu(gpu).name, tp, None)
    except (SchedulerError, KeyError, ValueError) as exc:
        raise LaunchError(f"cannot estimate the capacity of {model} on {gpus} x {gpu}: {exc}; "
                          "give controller.capacity_rps") from None
    if not 0 < curve.capacity < 1e9:
        raise LaunchError(f"the simulator found no finite capacity for {model} on {gpus} x "
                          f"{gpu}; give controller.capacity_rps")
    return float(curve.capacity)


def capacity_config(profile: SlurmProfile) -> CapacityConfig:
    c = profile.controller
    if c is None:
        raise LaunchError("the profile has no `controller:` section (model, capacity_rps): "
                          "the launcher needs it to size the fleet")
    capacity = c.capacity_rps
    if capacity is None:
        assert c.gpu is not None  # the profile's validator requires one of the two
        capacity = simulated_capacity_rps(c.model, c.gpu, profile.gpus, c.mean_in, c.mean_out)
    return CapacityConfig(capacity_rps=capacity, min_jobs=c.min_jobs,
                          max_jobs=c.max_jobs, startup_s=c.startup_s,
                          lead_s=float(profile.signal_lead), idle_s=c.idle_s)


def job_views(queued: Iterable[tuple[str, str, float | None]],
              records: Iterable[NodeRecord],
              trusted: Callable[[NodeRecord], bool] | None = None,
              owner: Callable[[str], str | None] | None = None) -> list[JobView]:
    """(job id, state, end) from squeue, joined with the records labelled with that job.

    A `slurm_job` label is its record's claim, and job ids are public (every job's node
    shows its own), so a member could claim ours: marked idle, a busy job was cancelled;
    marked busy, an idle one held its GPUs to the time limit. `owner` (the peer id of the
    key in the job's home, launch/jobkeys.py) names the one peer whose claim counts; where
    it is unknown, `trusted` (certificate networks: the record's verified provider is the
    profile's) keeps the others out, and of several records claiming one job the busiest
    counts, so no claim makes a busy job look idle."""
    by_job: dict[str, list[NodeRecord]] = {}
    for rec in records:
        job = rec.meta.label("slurm_job")
        if job and rec.state < Lifecycle.DOWN and (trusted is None or trusted(rec)):
            by_job.setdefault(job, []).append(rec)
    out = []
    for job_id, state, end in queued:
        nodes = by_job.get(job_id, [])
        peer = owner(job_id) if owner is not None else None
        if peer is not None:
            nodes = [n for n in nodes if n.peer_id == peer]
        out.append(JobView(job_id, state, end,
                           serving=any(n.state is Lifecycle.SERVING for n in nodes),
                           inflight=max((n.meta.load.inflight for n in nodes), default=0)))
    return out


class SlurmLauncher:
    def __init__(self, slurm: Slurm, profile: SlurmProfile, clock: Clock,
                 demand: Callable[[], float], records: Callable[[], Iterable[NodeRecord]],
                 *, source: str = "", interval_s: float = 30.0,
                 capacity: CapacityConfig | None = None,
                 trusted: Callable[[NodeRecord], bool] | None = None,
                 job_keys: JobKeys | None = None) -> None:
        self.slurm = slurm
        self._trusted = trusted
        self.job_keys = job_keys if job_keys is not None else JobKeys(profile.fabric.home)
        self.profile = profile
        self.script = render_sbatch(profile, source=source)
        self.clock = clock
        self.config = capacity or capacity_config(profile)
        self._demand = demand
        self._records = records
        self.interval_s = interval_s
        self.state = CapacityState()
        self.applied: list[CapacityDecision] = []
        self._seen: set[str] = set()  # job ids squeue showed last round
        self._unconfirmed = 0  # placeholders made so far (their names)

    def _observe(self) -> tuple[list[tuple[str, str, float | None]], float,
                                dict[str, str | None]]:
        queued = [(j.job_id, j.state, j.end)
                  for j in self.slurm.queue(name=self.profile.job_name, mine=True)]
        start = self.slurm.test_start(self.script)
        wait = max(0.0, start - self.clock.wall()) if start is not None else 0.0
        self.job_keys.keep({job for job, _, _ in queued})
        owners = {job: self.job_keys.peer(job) for job, _, _ in queued}  # (file reads)
        return queued, wait, owners

    async def step(self) -> list[CapacityDecision]:
        queued, wait, owners = await asyncio.to_thread(self._observe)
        self._adopt([job for job, _, _ in queued])
        jobs = job_views(queued, self._records(), self._trusted, owners.get)
        now = self.clock.wall()
        decisions, self.state = decide(self._demand(), jobs, wait, now, self.state,
                                       self.config)
        for d in decisions:
            await asyncio.to_thread(self._apply, d, now)
        return decisions

    def _adopt(self, visible: list[str]) -> None:
        """A job of ours squeue shows for the first time, that we have no id for, is the one
        an sbatch that timed out queued: it takes the place of the oldest placeholder."""
        ours = {job for job, _ in self.state.submitted}
        new = sorted((j for j in visible if j not in self._seen and j not in ours),
                     key=lambda j: (len(j), j))
        self._seen = set(visible)
        submitted = []
        for job, t in self.state.submitted:
            if job.startswith(UNCONFIRMED) and new:
                job = new.pop(0)
                log.info("Slurm job %s is the submission that timed out", job)
            submitted.append((job, t))
        self.state = replace(self.state, submitted=tuple(submitted))

    def _apply(self, decision: CapacityDecision, now: float) -> None:
        if isinstance(decision, SubmitJobs):
            for _ in range(decision.count):
                try:
                    job = self.slurm.submit(self.script)
                except SlurmTimeout:
                    # Slurm may have queued it: count it as submitted (capacity.py keeps a
                    # submission squeue does not show for visible_after_s) until squeue shows
                    # a new job of ours, which takes its place (`_adopt`), or it expires.
                    self._unconfirmed += 1
                    self.state = replace(self.state, submitted=(
                        *self.state.submitted, (f"{UNCONFIRMED}{self._unconfirmed}", now)))
                    raise
                log.info("submitted Slurm job %s: %s", job, decision.reason)
                self.state = CapacityState(self.state.surplus_since,
                                           (*self.state.submitted, (job, now)))
        elif isinstance(decision, CancelJob):
            self.slurm.cancel(decision.job_id, signal=None if decision.pending else "TERM")
            log.info("cancelled Slurm job %s%s: %s", decision.job_id,
                     " (queued)" if decision.pending else " (draining)", decision.reason)
        self.applied.append(decision)

    async def run(self, stop: asyncio.Event) -> None:
        failing = FailureLog()
        while not stop.is_set():
            try:
                await self.step()
            except LaunchError as exc:  # Slurm briefly unreachable: try again next round
                failing.failed(str(exc), self.clock.now())
            else:
                failing.succeeded()
            await self.clock.sleep(self.interval_s)


class FailureLog:
    """The launcher's failed rounds in the log without one line per round: a Slurm that never
    answers (no slurmctld on this host, a maintenance window) fails every 30 s for hours.
    An error when the failure starts or its message changes, a reminder every
    `REMIND_S` while it lasts, and a line when a round works again."""

    REMIND_S = 600.0

    def __init__(self) -> None:
        self.message = ""  # the failure under way ("": rounds work)
        self.rounds = 0  # failed rounds in a row
        self._logged_at = 0.0

    def failed(self, message: str, now: float) -> None:
        self.rounds += 1
        if message != self.message:
            self.message, self._logged_at = message, now
            log.error("launcher round failed: %s (retried every round; the next identical "
                      "failure is logged in %.0f min)", message, self.REMIND_S / 60)
        elif now - self._logged_at >= self.REMIND_S:
            self._logged_at = now
            log.error("launcher rounds still failing (%d in a row): %s", self.rounds, message)

    def succeeded(self) -> None:
        if self.message:
            log.warning("launcher round worked again after %d failed round(s)", self.rounds)
        self.message, self.rounds = "", 0
