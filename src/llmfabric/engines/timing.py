"""How long the simulated engine takes: prefill of a prompt and one decode step of a batch.

`timing_for(gpu, model, tp)` returns, when llmfabric.sim knows both names, its calibrated
step cost model (SimCostTiming), or failing that a RooflineTiming from its specs
(memory-bound decode: weights + KV cache read per step; compute-bound prefill); else a
TableTiming keyed by GPU class. Both model continuous
batching the way vLLM behaves: one decode step serves every running sequence, so per-token
time grows slowly with the number of concurrent streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from llmfabric.untrusted import get_logger

log = get_logger(__name__)

# Fractions of peak that real engines reach (vLLM on H100: ~50 % MFU prefill, ~70-80 % of HBM
# bandwidth in decode), plus a fixed per-step overhead (scheduler, sampling, kernel launches).
_MFU = 0.5
_MBU = 0.75
_STEP_OVERHEAD_S = 0.002
_PREFILL_OVERHEAD_S = 0.010


class TimingModel(Protocol):
    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds to prefill one prompt (time to first token, without queueing)."""
        ...

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds for one decode step of `batch` sequences holding `context_tokens` in all."""
        ...


@dataclass(frozen=True, slots=True)
class TableTiming:
    """A per-GPU-class table: TTFT = base + per prompt token; step = base + per sequence."""

    prefill_base_s: float = 0.030
    prefill_per_token_s: float = 0.0002
    step_base_s: float = 0.020
    step_per_seq_s: float = 0.0003
    step_per_ctx_token_s: float = 2e-8

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * max(0, prompt_tokens)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return (
            self.step_base_s
            + self.step_per_seq_s * max(0, batch - 1)
            + self.step_per_ctx_token_s * max(0, context_tokens)
        )


# Roughly an 8B model in bf16 on each class (tp=1).
GPU_TABLE: dict[str, TableTiming] = {
    "h200": TableTiming(0.015, 0.00006, 0.0055, 0.00008),
    "h100": TableTiming(0.018, 0.00008, 0.0075, 0.0001),
    "a100": TableTiming(0.025, 0.00016, 0.011, 0.00015),
    "l40": TableTiming(0.035, 0.00035, 0.022, 0.0003),
    "a6000": TableTiming(0.040, 0.0004, 0.023, 0.0003),
    "3090": TableTiming(0.040, 0.0005, 0.020, 0.0003),
    "4090": TableTiming(0.030, 0.0003, 0.018, 0.0003),
    "cpu": TableTiming(0.400, 0.005, 0.120, 0.004),
}
DEFAULT_TIMING = TableTiming()


def table_timing(gpu: str) -> TableTiming:
    key = gpu.lower().replace("_", "-")
    for name, timing in GPU_TABLE.items():
        if name in key:
            return timing
    return DEFAULT_TIMING


@dataclass(frozen=True, slots=True)
class RooflineTiming:
    """Roofline estimate from peak FLOP/s and memory bandwidth (values from llmfabric.sim)."""

    flops: float  # peak dense FLOP/s at the weights' precision, per GPU
    mem_bw: float  # bytes/s per GPU
    active_params: float
    weight_bytes: float  # active weights read per decode step (whole model)
    kv_bytes_per_token: float
    tp: int = 1

    def prefill_s(self, prompt_tokens: int) -> float:
        n = max(1, prompt_tokens)
        compute = 2.0 * self.active_params * n / (self.flops * _MFU * self.tp)
        memory = self.weight_bytes / (self.mem_bw * _MBU * self.tp)
        return _PREFILL_OVERHEAD_S + max(compute, memory)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        b = max(1, batch)
        read = self.weight_bytes + self.kv_bytes_per_token * max(0, context_tokens)
        memory = read / (self.mem_bw * _MBU * self.tp)
        compute = 2.0 * self.active_params * b / (self.flops * _MFU * self.tp)
        return _STEP_OVERHEAD_S + max(memory, compute)


class SimCostTiming:
    """llmfabric.sim's calibrated per-iteration cost model (sim.costs.StepCostModel)."""

    def __init__(self, cost_model: Any) -> None:
        self._cm = cost_model

    def prefill_s(self, prompt_tokens: int) -> float:
        return float(self._cm.prefill_time([max(1, prompt_tokens)]))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return float(self._cm.decode_step_time(max(1, batch), float(max(0, context_tokens))))


def timing_for(gpu: str, model: str, tp: int = 1) -> TimingModel:
    """The best timing model available for this GPU and model name: llmfabric.sim's step
    cost model, else our own roofline from its specs, else the per-GPU table."""
    try:
        from llmfabric.sim.costs import cost_model

        return SimCostTiming(cost_model(model, gpu, tp=max(1, tp)))
    except Exception as exc:
        log.info("sim engine: no sim cost model for %s/%s (%s)", gpu, model, exc)
    try:
        from llmfabric.sim.hardware import get_gpu
        from llmfabric.sim.models import get_model

        g = get_gpu(gpu)
        m = get_model(model)
    except Exception as exc:  # unknown names, or the simulator package is not there
        log.info("sim engine: table timing for %s/%s (%s)", gpu, model, exc)
        return table_timing(gpu)
    active = float(m.active_params())
    return RooflineTiming(
        flops=float(g.flops(m.weight_bits)),
        mem_bw=float(g.mem_bw),
        active_params=active,
        weight_bytes=active * m.weight_bits / 8.0,
        kv_bytes_per_token=float(m.kv_bytes_per_token()),
        tp=max(1, tp),
    )


def model_max_context(model: str, default: int = 4096) -> int:
    """The model's context length from llmfabric.sim's presets, else `default`."""
    from llmfabric.sim.errors import SimError
    from llmfabric.sim.models import get_model

    try:
        return int(get_model(model).max_context)
    except (SimError, OSError, ValueError):  # unknown name, unreadable config.json
        return default
