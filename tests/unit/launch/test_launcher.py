"""The launcher as executor: it observes a (fake, stateful) Slurm queue and the registry,
applies `capacity.decide`'s decisions with sbatch/scancel, on a virtual clock."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import pathlib
from collections.abc import Sequence
from typing import Any

import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.launch.errors import SlurmTimeout
from llmfabric.launch.jobkeys import JobKeys, job_home
from llmfabric.launch.launcher import FailureLog, SlurmLauncher, job_views
from llmfabric.launch.profile import parse_profile
from llmfabric.launch.slurm import Slurm
from llmfabric.registry.records import Lifecycle, LoadHints, NodeMeta, NodeRecord
from llmfabric.testing.fake_clock import FakeClock


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds")


class FakeSlurm:
    """sbatch/squeue/scancel over an in-memory queue; jobs start when `start()` is called."""

    def __init__(self, clock: FakeClock, time_limit_s: float) -> None:
        self.clock = clock
        self.limit = time_limit_s
        self.jobs: dict[str, dict[str, Any]] = {}
        self.cancelled: list[list[str]] = []
        self.scripts: list[str] = []

    def start(self, job: str) -> None:
        self.jobs[job].update(state="RUNNING", end=self.clock.wall() + self.limit)

    def __call__(self, argv: Sequence[str], stdin: str | None) -> tuple[int, str, str]:
        if argv[:2] == ["sbatch", "--parsable"]:
            job = str(100 + len(self.jobs))
            self.jobs[job] = {"state": "PENDING", "end": None}
            self.scripts.append(stdin or "")
            return 0, f"{job}\n", ""
        if argv[:2] == ["sbatch", "--test-only"]:
            at = iso(self.clock.wall() + 60)
            return 0, "", f"sbatch: Job 9 to start at {at} using 1 processors on nodes n1\n"
        if argv[0] == "squeue":
            assert "--me" in argv  # never another user's jobs of the same name
            rows = [f"{j}|llmfabric-sim|{v['state']}|N/A|"
                    f"{iso(v['end']) if v['end'] else 'N/A'}|None|n1"
                    for j, v in self.jobs.items()]
            return 0, "\n".join(rows) + "\n", ""
        if argv[0] == "scancel":
            self.cancelled.append(list(argv))
            self.jobs.pop(argv[-1], None)
            return 0, "", ""
        return 1, "", f"unexpected {argv}"


PROFILE = parse_profile({
    "name": "sim", "time": "60", "signal_lead": 120, "engine": "llmfabric engine sim",
    "fabric": {"bootstrap": ["i:7946"], "secret_file": "/s"},
    "controller": {"model": "m", "capacity_rps": 1.0, "max_jobs": 3, "startup_s": 60,
                   "idle_s": 300}})


def node_of(job: str, inflight: int = 0) -> NodeRecord:
    meta = NodeMeta(labels=(("slurm_job", job),), load=LoadHints(inflight=inflight))
    return NodeRecord(f"s{job}", "p", b"", Lifecycle.SERVING, 0, 0, 0.0, meta)


async def test_grows_replaces_and_shrinks_the_fleet() -> None:
    clock = FakeClock(wall_start=datetime.datetime(2026, 11, 24, 3).timestamp())
    fake = FakeSlurm(clock, 3600)
    demand = [2.5]
    records: list[NodeRecord] = []
    launcher = SlurmLauncher(Slurm(fake), PROFILE, clock, lambda: demand[0], lambda: records)

    assert [type(d).__name__ for d in await launcher.step()] == ["SubmitJobs"]
    assert sorted(fake.jobs) == ["100", "101"]  # 2 a round at most
    assert "--signal=B:TERM@120" in fake.scripts[0]
    await launcher.step()
    assert sorted(fake.jobs) == ["100", "101", "102"]  # 3 needed
    assert await launcher.step() == []  # queued jobs count: no more submissions
    for job in list(fake.jobs):
        fake.start(job)
    records[:] = [node_of(j) for j in fake.jobs]
    assert await launcher.step() == []

    # Allocations end in an hour; with a 60 s queue wait and 60 s startup, replacements go
    # out once the drain moment (end - 120 s) is less than 120 s away.
    await clock.advance(3600 - 120 - 121)
    assert await launcher.step() == []
    await clock.advance(2)
    out = await launcher.step()
    assert [type(d).__name__ for d in out] == ["SubmitJobs"] and "replacing" in out[0].reason

    # Demand gone: after the idle hysteresis, queued replacements are cancelled first.
    demand[0] = 0.0
    before = len(fake.jobs)
    await launcher.step()
    await clock.advance(301)
    await launcher.step()
    assert len(fake.jobs) == before - 1 and fake.cancelled[-1] == ["scancel", "104"]


def test_job_views_join_the_registry_by_label() -> None:
    records = [node_of("7", inflight=2),
               NodeRecord("x", "p", b"", Lifecycle.LEFT, 0, 0, 0.0,
                          NodeMeta(labels=(("slurm_job", "8"),)))]
    views = job_views([("7", "RUNNING", 1.0), ("8", "RUNNING", 2.0), ("9", "PENDING", None)],
                      records)
    assert [(v.job_id, v.serving, v.inflight) for v in views] == [
        ("7", True, 2), ("8", False, 0), ("9", False, 0)]


def test_a_member_claiming_our_job_cannot_make_it_look_idle_or_steer_it() -> None:
    """Job ids are public, so any member can label its record `slurm_job=<ours>`. Of several
    claims the busiest counts (a claim of idleness cannot get a busy job cancelled); with a
    trust check (certificate networks: the verified provider is the profile's), the others'
    claims are not read at all (one cannot keep an idle job alive either)."""
    ours = node_of("7", inflight=3)
    liar_idle = dataclasses.replace(node_of("7", inflight=0), session_id="liar1",
                                    peer_id="evil")
    liar_busy = dataclasses.replace(node_of("8", inflight=9), session_id="liar2",
                                    peer_id="evil")
    queued = [("7", "RUNNING", 1.0), ("8", "RUNNING", 2.0)]
    for order in ([ours, liar_idle, liar_busy], [liar_busy, liar_idle, ours]):
        views = job_views(queued, order)
        assert [(v.job_id, v.inflight) for v in views] == [("7", 3), ("8", 9)]
        views = job_views(queued, order, trusted=lambda r: r.peer_id != "evil")
        assert [(v.job_id, v.serving, v.inflight) for v in views] == [
            ("7", True, 3), ("8", False, 0)]


def test_job_home_expands_as_the_sbatch_shell_would() -> None:
    env = {"HOME": "/home/u", "SCRATCH": "/scratch/u"}
    assert job_home("$HOME/.llmfabric/slurm/$SLURM_JOB_ID", "42", env) == pathlib.Path(
        "/home/u/.llmfabric/slurm/42")
    assert job_home("~/h-${SLURM_JOB_ID}", "7", env) == pathlib.Path("/home/u/h-7")
    assert job_home("${SCRATCH}/fabric/$SLURM_JOB_ID", "7", env) == pathlib.Path(
        "/scratch/u/fabric/7")
    assert job_home("$WORK/$SLURM_JOB_ID", "7", env) is None  # unset here: not guessed


def test_only_the_node_under_the_key_in_its_home_speaks_for_a_job(
        tmp_path: pathlib.Path) -> None:
    """On a PSK network any member can label its record `slurm_job=<ours>` and claim it busy,
    holding an idle job's GPUs to its time limit. Once the launcher reads the node key in the
    job's home, only records under that key count; jobs whose key it cannot read yet fall
    back to the busiest claim."""
    key = NodeKey.generate()
    (tmp_path / "home-7").mkdir()
    key.save(tmp_path / "home-7" / "node.key")
    keys = JobKeys(str(tmp_path / "home-$SLURM_JOB_ID"), env={})
    ours = dataclasses.replace(node_of("7", inflight=0), peer_id=key.peer_id)
    liar = dataclasses.replace(node_of("7", inflight=9), session_id="liar", peer_id="evil")
    liar8 = dataclasses.replace(node_of("8", inflight=9), session_id="liar8", peer_id="evil")
    queued = [("7", "RUNNING", 1.0), ("8", "RUNNING", 2.0)]
    views = job_views(queued, [liar, ours, liar8], owner=keys.peer)
    assert [(v.job_id, v.serving, v.inflight) for v in views] == [
        ("7", True, 0), ("8", True, 9)]  # (8: no key to read, the claims count)
    assert keys.peer("8") is None and keys.peer("7") == key.peer_id
    keys.keep({"8"})  # job 7 left the queue: forgotten
    assert keys._peers == {}


async def test_a_busy_claim_by_another_member_no_longer_pins_an_idle_job(
        tmp_path: pathlib.Path) -> None:
    """The launcher end to end (fake Slurm, virtual clock): demand is gone and our job's node
    is idle; another member claims the job busy. The job is cancelled after the idle
    hysteresis when its key is readable, and held while it is not."""
    for readable in (True, False):
        clock = FakeClock(wall_start=datetime.datetime(2026, 12, 2, 3).timestamp())
        fake = FakeSlurm(clock, 3600)
        fake.jobs["7"] = {"state": "RUNNING", "end": clock.wall() + 3600}
        homes = tmp_path / str(readable)
        key = NodeKey.generate()
        if readable:
            (homes / "h-7").mkdir(parents=True)
            key.save(homes / "h-7" / "node.key")
        ours = dataclasses.replace(node_of("7", inflight=0), peer_id=key.peer_id)
        liar = dataclasses.replace(node_of("7", inflight=5), session_id="l", peer_id="evil")
        launcher = SlurmLauncher(Slurm(fake), PROFILE, clock, lambda: 0.0,
                                 lambda records=[ours, liar]: records,
                                 job_keys=JobKeys(str(homes / "h-$SLURM_JOB_ID"), env={}))
        await launcher.step()
        await clock.advance(301)  # past idle_s
        await launcher.step()
        assert [c[-1] for c in fake.cancelled] == (["7"] if readable else [])


class SlowSlurm(FakeSlurm):
    """The next `timeouts` sbatch calls time out (as `subprocess_runner` raises it), queuing
    their job or not (`accepts`); squeue shows a job only `lag` rounds of squeue after it was
    queued (an overloaded slurmctld)."""

    def __init__(self, clock: FakeClock, timeouts: int, accepts: bool, lag: int) -> None:
        super().__init__(clock, 3600)
        self.timeouts, self.accepts, self.lag = timeouts, accepts, lag
        self.hidden: dict[str, int] = {}

    def __call__(self, argv: Sequence[str], stdin: str | None) -> tuple[int, str, str]:
        if argv[:2] == ["sbatch", "--parsable"] and self.timeouts:
            self.timeouts -= 1
            if self.accepts:
                job = str(100 + len(self.jobs))
                self.jobs[job] = {"state": "PENDING", "end": None}
                self.hidden[job] = self.lag
            raise SlurmTimeout("sbatch did not answer within 60 s")
        if argv[0] == "squeue":
            shown = {j: v for j, v in self.jobs.items() if self.hidden.get(j, 0) <= 0}
            for j in self.hidden:
                self.hidden[j] -= 1
            everything, self.jobs = self.jobs, shown
            try:
                return super().__call__(argv, stdin)
            finally:
                self.jobs = everything
        return super().__call__(argv, stdin)


async def _rounds(launcher: SlurmLauncher, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        with contextlib.suppress(SlurmTimeout):
            await launcher.step()
        await clock.advance(30)


@pytest.mark.hostile
async def test_an_sbatch_that_timed_out_after_slurm_queued_the_job_is_counted() -> None:
    """sbatch timed out (slurmctld busy) after Slurm had queued the job: it was not counted
    until squeue showed it, so each round submitted again, past the jobs needed. It is
    counted from the timeout on; the job squeue then shows for the first time takes its
    place, and no second job is submitted."""
    clock = FakeClock(wall_start=datetime.datetime(2026, 11, 24, 3).timestamp())
    fake = SlowSlurm(clock, timeouts=1, accepts=True, lag=3)
    launcher = SlurmLauncher(Slurm(fake), PROFILE, clock, lambda: 1.0, lambda: [])
    await _rounds(launcher, clock, 12)  # 6 minutes: past visible_after_s
    assert sorted(fake.jobs) == ["100"]  # the one job needed, never a second
    assert [job for job, _ in launcher.state.submitted] == ["100"]


@pytest.mark.hostile
async def test_an_sbatch_that_timed_out_without_a_job_is_retried_after_visible_after_s(
) -> None:
    clock = FakeClock(wall_start=datetime.datetime(2026, 11, 24, 3).timestamp())
    fake = SlowSlurm(clock, timeouts=1, accepts=False, lag=0)
    launcher = SlurmLauncher(Slurm(fake), PROFILE, clock, lambda: 1.0, lambda: [])
    await _rounds(launcher, clock, 3)
    assert fake.jobs == {}  # counted as queued meanwhile
    await _rounds(launcher, clock, 3)  # past 120 s
    assert sorted(fake.jobs) == ["100"]



def test_a_slurm_that_never_answers_is_logged_once_then_every_ten_minutes(
        caplog: pytest.LogCaptureFixture) -> None:
    """The launcher's loop fails every 30 s round while Slurm does not answer; the log says
    so when it starts, when its message changes, every 10 minutes while it lasts, and when a
    round works again (it was one error line per round, for hours)."""
    caplog.set_level(logging.WARNING, logger="llmfabric")
    failing = FailureLog()
    down = "slurm_load_jobs error: Unable to contact slurm controller"
    for i in range(41):  # rounds at 0, 30, ..., 1200 s
        failing.failed(down, 30.0 * i)
    failing.failed("sbatch: error: Batch job submission failed", 1230.0)
    failing.succeeded()
    failing.succeeded()  # (nothing more to say)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.ERROR] * 4 + [logging.WARNING]
    assert down in lines[0][1]
    assert "still failing (21 in a row)" in lines[1][1]  # at 600 s
    assert "still failing (41 in a row)" in lines[2][1]  # at 1200 s
    assert "Batch job submission failed" in lines[3][1]  # a new message: at once
    assert "worked again after 42 failed round(s)" in lines[4][1]
    assert failing.rounds == 0
