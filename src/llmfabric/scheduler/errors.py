"""Scheduler errors. Messages say what to change."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base class of every error the scheduler raises."""


class SpecError(SchedulerError, ValueError):
    """A cluster, workload or option is invalid (bad YAML, unknown GPU or model, bad number)."""


class InfeasibleError(SchedulerError):
    """No placement satisfies the constraints (e.g. no GPU type can hold a model's weights)."""


class SolverError(SchedulerError):
    """The solver failed or ran out of time without any feasible solution."""
