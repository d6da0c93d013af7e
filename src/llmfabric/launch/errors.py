"""Errors of the launchers; every message says what to change."""

from __future__ import annotations


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
