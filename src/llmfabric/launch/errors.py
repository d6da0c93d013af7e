"""Errors of the launchers; every message says what to change."""

from __future__ import annotations

from pydantic import ValidationError


class LaunchError(Exception):
    """Base class of launcher errors."""


class ProfileError(LaunchError):
    """A launch profile (YAML) is invalid; the message names the field."""


class SlurmError(LaunchError):
    """A Slurm command failed or answered something we cannot read (one line, from Slurm)."""


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer in time: Slurm may still have carried it out (an sbatch
    that timed out may have queued its job)."""


class SlurmMissing(SlurmError):
    """A Slurm command is not on PATH (not a Slurm login node): nothing was submitted."""


def profile_problems(exc: ValidationError, keys_doc: str) -> str:
    """A profile's validation errors on one line, each named by its field; an unknown key
    says so and where the keys are listed (pydantic says 'Extra inputs are not permitted')."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "profile"
        what = (f"unknown key (the keys: {keys_doc})" if err["type"] == "extra_forbidden"
                else str(err["msg"]).removeprefix("Value error, "))
        problems.append(f"{where}: {what}")
    return "; ".join(problems)
