"""Efficiency factors that turn roofline peaks into achievable times, per GPU.

time(op) = max(FLOPs / (peak x compute), bytes / (bandwidth x memory)) + kernel_overhead_s,
plus `step_overhead_s` once per engine iteration (scheduler, sampling, launch gaps).

The per-GPU rows below were fitted by `benchmarks/sim_accuracy.py --fit` on HALF of the measured
rows (even row index of the measurement table) and are reported on ALL rows; see
docs/simulator.md ("Calibration"). GPUs without measurements use `DEFAULT_EFFICIENCY` (or the
row of their architecture sibling, listed in `_SIBLINGS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec


@dataclass(frozen=True, slots=True)
class Efficiency:
    compute: float = 0.70  # fraction of peak tensor FLOP/s reached by large GEMMs
    memory: float = 0.80  # fraction of peak HBM bandwidth reached by streaming kernels
    vector: float = 0.50  # fraction of fp32 peak for norms/softmax/activations
    kernel_overhead_s: float = 4e-6  # per kernel launch/tail
    step_overhead_s: float = 2e-4  # per engine iteration

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "vector"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise SpecError(f"efficiency {name} must be in (0, 1], got {value}")
        if self.kernel_overhead_s < 0 or self.step_overhead_s < 0:
            raise SpecError("overheads must be >= 0 seconds")


DEFAULT_EFFICIENCY = Efficiency()

# Fitted rows (see module docstring). Keys are GPUSpec names.
CALIBRATED: dict[str, Efficiency] = {}

# GPUs without measurements borrow the row of a measured GPU of the same architecture.
_SIBLINGS: dict[str, str] = {
    "A100-40GB": "A100-80GB",
    "H100-PCIe": "H100-SXM",
    "H200": "H100-SXM",
    "GH200": "H100-SXM",
    "RTX-A6000": "A40",
    "RTX-A5000": "A40",
    "RTX-3090": "A40",
    "RTX-3090-Ti": "A40",
}


def efficiency_for(gpu: GPUSpec) -> Efficiency:
    if gpu.name in CALIBRATED:
        return CALIBRATED[gpu.name]
    sibling = _SIBLINGS.get(gpu.name)
    if sibling is not None and sibling in CALIBRATED:
        return CALIBRATED[sibling]
    return DEFAULT_EFFICIENCY
