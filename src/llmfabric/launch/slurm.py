"""Slurm's client commands (sbatch, squeue, sacct, scancel, scontrol) behind one small class.

The commands run through an injected `Runner` (argv, stdin -> exit code, stdout, stderr), so
the parsers are tested on Slurm's real output and the launcher on a fake. Every failure is a
SlurmError with ONE line: Slurm's own last error line (e.g. "Batch job submission failed:
Invalid partition name specified").
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmfabric.launch.errors import SlurmError, SlurmMissing, SlurmTimeout

# (argv, stdin text) -> (exit code, stdout, stderr)
Runner = Callable[[Sequence[str], str | None], tuple[int, str, str]]


def subprocess_runner(env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Runner:
    def run(argv: Sequence[str], stdin: str | None) -> tuple[int, str, str]:
        try:
            done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                                  timeout=timeout, env=dict(env) if env is not None else None,
                                  check=False)
        except FileNotFoundError:
            raise SlurmMissing(f"{argv[0]} not found: run this on a Slurm login node (or put "
                             "Slurm's commands on PATH)") from None
        except subprocess.TimeoutExpired:
            raise SlurmTimeout(f"{argv[0]} did not answer within {timeout:g} s") from None
        return done.returncode, done.stdout, done.stderr
    return run


def parse_time(text: str) -> float | None:
    """Slurm's local ISO time ("2026-11-24T02:26:13") -> Unix seconds; None for N/A,
    Unknown, None, 0 and the like."""
    text = text.strip()
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def one_line_error(stderr: str, fallback: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return fallback
    # sbatch prints the cause first and "Batch job submission failed: <reason>" last.
    return lines[-1].removeprefix("sbatch: error: ").removeprefix("error: ")


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One job as squeue shows it."""

    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETING, ...
    start: float | None  # actual start (running), Slurm's estimate (pending: = squeue --start)
    end: float | None  # when the time limit ends it (running), else None
    reason: str
    nodes: str


@dataclass(frozen=True, slots=True)
class FinishedJob:
    job_id: str
    state: str  # COMPLETED, CANCELLED, TIMEOUT, FAILED, ...
    exit_code: str
    elapsed: str


_SQUEUE_FORMAT = "%i|%j|%T|%S|%e|%r|%N"


def parse_squeue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7:
            continue
        jid, name, state, start, end, reason, nodes = parts
        jobs.append(QueuedJob(jid, name, state, parse_time(start),
                              parse_time(end) if state != "PENDING" else None, reason, nodes))
    return jobs


def parse_sacct(text: str) -> list[FinishedJob]:
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 4 and "." not in parts[0]:  # skip steps (123.batch)
            out.append(FinishedJob(parts[0], parts[1].split()[0] if parts[1] else "",
                                   parts[2], parts[3]))
    return out


def parse_test_only(stderr: str) -> float | None:
    """`sbatch --test-only`: "Job 12 to start at 2026-11-24T02:26:12 using ..." -> time."""
    marker = " to start at "
    for line in stderr.splitlines():
        if marker in line:
            return parse_time(line.split(marker, 1)[1].split()[0])
    return None


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol show job -o ID` -> {key: value} (values without spaces, as scontrol -o)."""
    out: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


class Slurm:
    def __init__(self, runner: Runner | None = None) -> None:
        self.run = runner or subprocess_runner()

    def _call(self, argv: Sequence[str], stdin: str | None = None) -> tuple[str, str]:
        code, out, err = self.run(argv, stdin)
        if code != 0:
            raise SlurmError(one_line_error(err, f"{argv[0]} exited with status {code}"))
        return out, err

    def submit(self, script: str, extra: Sequence[str] = ()) -> str:
        """sbatch --parsable (the script on stdin) -> the job id."""
        out, _ = self._call(["sbatch", "--parsable", *extra], script)
        job_id = out.strip().split(";")[0]  # "<id>[;<cluster>]"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def test_start(self, script: str, *, strict: bool = False) -> float | None:
        """When a job of this script would start (`sbatch --test-only`), None if unknown
        (`strict`: a refusal raises SlurmError instead)."""
        try:
            _, err = self._call(["sbatch", "--test-only"], script)
        except SlurmError:
            if strict:
                raise
            return None
        return parse_test_only(err)

    def queue(self, job_ids: Sequence[str] = (), name: str | None = None,
              mine: bool = False) -> list[QueuedJob]:
        """Jobs in the queue: these ids, or by job name; `mine`: only the caller's (another
        operator's launcher may use the same profile name)."""
        argv = ["squeue", "-h", "-o", _SQUEUE_FORMAT, *(["--me"] if mine else [])]
        if job_ids:
            argv += ["-j", ",".join(job_ids)]
        if name:
            argv += ["--name", name]
        code, out, err = self.run(argv, None)
        if code != 0:
            if "Invalid job id" in err:  # every listed job left the queue already
                return []
            raise SlurmError(one_line_error(err, f"squeue exited with status {code}"))
        return parse_squeue(out)

    def accounting(self, job_ids: Sequence[str]) -> list[FinishedJob]:
        """sacct for jobs that left the queue; SlurmError when accounting is off."""
        out, _ = self._call(["sacct", "-n", "-P", "-o", "JobID,State,ExitCode,Elapsed", "-j",
                             ",".join(job_ids)])
        return parse_sacct(out)

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        argv = ["scancel", *([f"--signal={signal}", "--batch"] if signal else []), job_id]
        self._call(argv)

    def job(self, job_id: str) -> dict[str, str]:
        out, _ = self._call(["scontrol", "show", "job", "-o", job_id])
        return parse_scontrol_job(out)
