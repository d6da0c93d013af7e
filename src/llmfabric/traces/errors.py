"""Errors of the traces package. Messages say what the caller should do next."""

from __future__ import annotations


class TraceError(Exception):
    """Base class for every error raised by llmfabric.traces."""


class TraceFormatError(TraceError):
    """A trace file does not match the format it was read as (missing column, bad value)."""


class UnknownTraceFormatError(TraceError):
    """The format could not be detected, or the name given is not a known format."""
