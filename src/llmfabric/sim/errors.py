"""The simulator's exception hierarchy. Messages say what to do about the problem."""

from __future__ import annotations


class SimError(Exception):
    """Base class of every error raised by llmfabric.sim."""


class UnknownGPUError(SimError, KeyError):
    """A GPU name matched no built-in or user-supplied spec."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class UnknownModelError(SimError, KeyError):
    """A model name matched no preset and is not a path to a config.json."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SpecError(SimError, ValueError):
    """A GPU or model spec (YAML / config.json / arguments) is invalid."""


class InfeasibleError(SimError):
    """The model does not fit on the requested GPUs (weights + KV for one sequence)."""


class WorkloadError(SimError, ValueError):
    """A workload description or trace file is invalid."""
