"""`gpu_hint()`: an error's unknown-GPU hint as the command at hand can follow it. The
simulator's message ends with the Python call that adds a GPU; a command that takes
`--gpus-yaml FILE` (`simulate`, `plan pd`, `controller --pd-plan`) names that option instead,
one without it (`plan`, `plan net`, `simulate flying`) names nothing: it cannot add a GPU.
"""

from __future__ import annotations

from llmfabric.sim.errors import ADD_GPUS_HINT

GPUS_YAML_HINT = "Add your own with --gpus-yaml FILE (docs/simulator.md)."


def gpu_hint(message: str, *, gpus_yaml: bool) -> str:
    """`message` with the simulator's Python hint replaced by the command's own (or none)."""
    return message.replace(f" {ADD_GPUS_HINT}", f" {GPUS_YAML_HINT}" if gpus_yaml else "")
