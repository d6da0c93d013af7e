"""AnalyticStandIn: a closed-form performance model for the scheduler's unit tests.

It is NOT the serving simulator (that is `llmfabric.sim`, reached through
`simadapter.SimPerformance`); it exists so scheduler tests do not depend on it. It follows the
same roofline idea in a few lines: prefill is compute bound, a decode step reads the weights
once per batch plus each sequence's KV cache, continuous batching finds the batch size that
Little's law implies, and an overloaded replica's queue grows over a finite horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.perf import Estimate, GpuInfo


@dataclass(frozen=True, slots=True)
class StandInGpu:
    memory_gb: float
    tflops: float  # dense bf16
    bandwidth_tbs: float
    cost_per_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class StandInModel:
    params_b: float
    kv_bytes_per_token: float  # summed over layers, bf16


STANDIN_GPUS: dict[str, StandInGpu] = {
    "A100-80GB": StandInGpu(80.0, 312.0, 2.0, 1.8),
    "A100-40GB": StandInGpu(40.0, 312.0, 1.55, 1.2),
    "H100-SXM": StandInGpu(80.0, 989.0, 3.35, 3.0),
    "GH200": StandInGpu(96.0, 989.0, 4.0, 3.5),
    "L40S": StandInGpu(48.0, 362.0, 0.86, 1.0),
    "RTX3090": StandInGpu(24.0, 71.0, 0.94, 0.3),
}

STANDIN_MODELS: dict[str, StandInModel] = {
    "Llama-2-7b": StandInModel(6.7, 524288.0),
    "Llama-2-13b": StandInModel(13.0, 819200.0),
    "CodeLlama-34b": StandInModel(34.0, 196608.0),
    "Llama-3.3-70B-Instruct": StandInModel(70.6, 327680.0),
    "Qwen3-1.7B": StandInModel(1.7, 114688.0),
}


class AnalyticStandIn:
    """Stand-in PerformanceModel (tests only; benchmarks use the simulator adapter)."""

    def __init__(
        self,
        gpus: dict[str, StandInGpu] | None = None,
        models: dict[str, StandInModel] | None = None,
        *,
        horizon_s: float = 120.0,
        mem_utilization: float = 0.9,
        max_batch: int = 256,
    ) -> None:
        self.gpus = dict(STANDIN_GPUS if gpus is None else gpus)
        self.models = dict(STANDIN_MODELS if models is None else models)
        self.horizon_s = horizon_s
        self.mem_utilization = mem_utilization
        self.max_batch = max_batch
        self.calls = 0

    def _gpu(self, name: str) -> StandInGpu:
        try:
            return self.gpus[name]
        except KeyError:
            raise SpecError(f"unknown GPU type {name!r}; known: {sorted(self.gpus)}") from None

    def _model(self, name: str) -> StandInModel:
        try:
            return self.models[name]
        except KeyError:
            raise SpecError(f"unknown model {name!r}; known: {sorted(self.models)}") from None

    def gpu(self, gpu_type: str) -> GpuInfo:
        g = self._gpu(gpu_type)
        return GpuInfo(gpu_type, g.memory_gb, g.cost_per_hour, rank=g.bandwidth_tbs)

    def params_b(self, model: str) -> float:
        return self._model(model).params_b

    def _kv_slots(self, model: str, gpu_type: str, tp: int) -> float:
        """How many tokens of KV cache fit beside the weights on `tp` GPUs."""
        g, m = self._gpu(gpu_type), self._model(model)
        free_gb = g.memory_gb * tp * self.mem_utilization - 2.0 * m.params_b
        return max(0.0, free_gb * 1e9 / m.kv_bytes_per_token)

    def fits(self, model: str, gpu_type: str, tp: int, mean_in: float, mean_out: float) -> bool:
        return self._kv_slots(model, gpu_type, tp) >= mean_in + mean_out

    def estimate(
        self,
        model: str,
        gpu_type: str,
        tp: int,
        arrival_rate: float,
        mean_in: float,
        mean_out: float,
    ) -> Estimate:
        self.calls += 1
        g, m = self._gpu(gpu_type), self._model(model)
        ctx = mean_in + mean_out
        slots = self._kv_slots(model, gpu_type, tp)
        if slots < ctx:
            return Estimate(math.inf, 0.0, feasible=False, saturated=True)
        flops = g.tflops * 1e12 * tp * 0.5  # achieved
        bw = g.bandwidth_tbs * 1e12 * tp * 0.7
        comm = 0.0 if tp == 1 else 2e-5 * math.log2(tp)  # per layer all-reduce, folded in
        weights = 2.0 * m.params_b * 1e9
        prefill = 2.0 * m.params_b * 1e9 * max(mean_in, 1.0) / flops
        bmax = max(1.0, min(float(self.max_batch), slots / ctx))

        def step(batch: float) -> float:
            kv = batch * (mean_in + mean_out / 2.0) * m.kv_bytes_per_token
            return max(weights / bw, 2.0 * m.params_b * 1e9 * batch / flops) + kv / bw + comm

        def service(batch: float) -> float:
            return prefill * 1.0 + mean_out * step(batch)

        cap = bmax / service(bmax)  # requests per second at full batch
        if arrival_rate <= 0:
            e2e = service(1.0)
            return Estimate(e2e, 0.0, mean_ttft_s=prefill, mean_tpot_s=step(1.0))
        if arrival_rate < cap:
            batch = 1.0
            for _ in range(60):  # Little's law fixed point: B = rate * latency(B)
                batch = min(bmax, max(1.0, arrival_rate * service(batch)))
            rho = arrival_rate / cap
            e2e = service(batch) * (1.0 + 0.5 * rho * rho / (1.0 - min(rho, 0.98)) * 0.1)
            return Estimate(e2e, arrival_rate, mean_ttft_s=prefill, mean_tpot_s=step(batch))
        # Overloaded: requests arriving over the horizon wait for the backlog to drain.
        wait = 0.5 * self.horizon_s * (1.0 - cap / arrival_rate)
        e2e = service(bmax) + wait
        return Estimate(e2e, cap, saturated=True, mean_ttft_s=prefill + wait,
                        mean_tpot_s=step(bmax))
