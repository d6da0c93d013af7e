"""The simulator's exception hierarchy. Messages say what to do about the problem."""

from __future__ import annotations


class SimError(Exception):
    """Base class of every error raised by llmfabric.sim."""


def naming_file(path: object, message: str, lead: str = "") -> str:
    """`message` about the file `path`, which it names once: as it is when the loader's own
    error names the file already, else after `lead` and the path ("trace x.csv: ...")."""
    where = str(path)
    return message if where in message else f"{lead}{where}: {message}"


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What a file read as text that is not is told: "not UTF-8 text (a 0xff byte)". The
    byte's value, not its offset: readers decode in chunks, so `exc.start` is an offset in
    one chunk, not in the file."""
    return f"not UTF-8 text (a 0x{exc.object[exc.start]:02x} byte)"


# How an unknown GPU's message ends: the Python way to add one. The CLI swaps it for the
# command's own way (--gpus-yaml FILE) or drops it where a command has none
# (llmfabric.cli.gpus_yaml).
ADD_GPUS_HINT = "Add your own with llmfabric.sim.load_gpus_yaml(path) (docs/simulator.md)."


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
