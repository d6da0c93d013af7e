"""The narrow performance interface the scheduler is built against.

Anything that can estimate how one replica (a model on `tp` GPUs of one type) behaves under a
Poisson load can drive placement: the serving simulator through `simadapter.SimPerformance`,
or the analytic stand-in `standin.AnalyticStandIn` that the unit tests use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Estimate:
    """One replica's steady behaviour at a given arrival rate.

    `mean_e2e_s` stays finite when the replica is overloaded: estimators report the mean over a
    finite horizon, so the queue's growth shows up as a large latency rather than infinity.
    """

    mean_e2e_s: float
    throughput_rps: float  # requests completed per second (<= the arrival rate)
    feasible: bool = True  # weights + KV cache fit in GPU memory
    saturated: bool = False  # arrival rate above what the replica can sustain
    mean_ttft_s: float = 0.0
    mean_tpot_s: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuInfo:
    name: str
    memory_gb: float
    cost_per_hour: float = 0.0
    # A relative speed used only by heuristics to order GPU types (higher is faster).
    rank: float = 1.0


class PerformanceModel(Protocol):
    def gpu(self, gpu_type: str) -> GpuInfo:
        """Spec of a GPU type; raise SpecError (or KeyError) for an unknown name."""
        ...

    def params_b(self, model: str) -> float:
        """Parameter count in billions (memP weighs models by it)."""
        ...

    def fits(self, model: str, gpu_type: str, tp: int, mean_in: float, mean_out: float) -> bool:
        """Whether weights + the KV cache of at least one request fit on `tp` GPUs."""
        ...

    def estimate(
        self,
        model: str,
        gpu_type: str,
        tp: int,
        arrival_rate: float,
        mean_in: float,
        mean_out: float,
    ) -> Estimate:
        """Mean end-to-end latency and throughput of ONE replica at `arrival_rate` req/s."""
        ...
