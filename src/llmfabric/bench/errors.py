"""Errors of the bench package. Messages say what the caller should change."""

from __future__ import annotations


class BenchError(Exception):
    """Base class for every error raised by llmfabric.bench."""


class BenchConfigError(BenchError):
    """The load run is misconfigured (unknown arrival process, unbounded run, bad numbers)."""
