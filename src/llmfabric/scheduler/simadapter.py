"""SimPerformance: the PerformanceModel backed by the serving simulator (`llmfabric.sim`).

Each estimate runs `simulate_replica` on a Poisson workload at the asked rate, with normal
input/output lengths when the workload gives spreads. The simulated window is `horizon_s`
long (shorter for high rates, to bound the request count); when a replica is saturated its
queueing delay grows with the window, so the mean E2E latency is scaled to `horizon_s` to keep
estimates at different rates comparable. Results are cached per (model, GPU, TP, rate, lengths).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from llmfabric import sim
from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.perf import Estimate, GpuInfo
from llmfabric.scheduler.problem import Workload


class SimPerformance:
    def __init__(self, *, horizon_s: float = 60.0, max_requests: int = 3000, seed: int = 0,
                 std_in: dict[str, float] | None = None, std_out: dict[str, float] | None = None
                 ) -> None:
        self.horizon_s = horizon_s
        self.max_requests = max_requests
        self.seed = seed
        self.std_in = dict(std_in or {})
        self.std_out = dict(std_out or {})
        self._cache: dict[tuple[str, str, int, float, float, float], Estimate] = {}
        self.calls = 0

    @classmethod
    def for_workload(cls, workload: Workload, **kwargs: Any) -> SimPerformance:
        """A SimPerformance that samples each model's lengths with the workload's spreads."""
        return cls(std_in={m.model: m.std_in for m in workload.loads},
                   std_out={m.model: m.std_out for m in workload.loads}, **kwargs)

    def _model(self, name: str) -> sim.ModelSpec:
        try:
            return sim.get_model(name)
        except sim.SimError as e:
            # Served names often carry a fine-tune suffix the presets do not list.
            base = name.rsplit("/", 1)[-1]
            for suffix in ("-Instruct", "-instruct", "-chat", "-Chat", "-hf", "-Instruct-hf"):
                if base.endswith(suffix):
                    try:
                        return sim.get_model(base[: -len(suffix)])
                    except sim.SimError:
                        pass
            # (the simulator's message names the model: said once, not wrapped in another)
            raise SpecError(str(e)) from None

    def _gpu(self, name: str) -> sim.GPUSpec:
        try:
            return sim.get_gpu(name)
        except sim.SimError as e:
            raise SpecError(str(e)) from None  # (names the GPU and the known ones)

    def gpu(self, gpu_type: str) -> GpuInfo:
        g = self._gpu(gpu_type)
        return GpuInfo(g.name, g.mem_bytes / 1e9, g.price_per_hour or 0.0, rank=g.mem_bw / 1e12)

    def params_b(self, model: str) -> float:
        return self._model(model).total_params() / 1e9

    def fits(self, model: str, gpu_type: str, tp: int, mean_in: float, mean_out: float) -> bool:
        need = max(1, math.ceil(mean_in + mean_out))
        return bool(sim.fits(self._model(model), self._gpu(gpu_type), tp, min_kv_tokens=need))

    def _lengths(self, mean: float, std: float, n: int, rng: np.random.Generator
                 ) -> int | list[int]:
        if std <= 0:
            return max(1, round(mean))
        values: list[int] = np.clip(np.rint(rng.normal(mean, std, n)), 1, None).astype(int).tolist()
        return values

    def estimate(self, model: str, gpu_type: str, tp: int, arrival_rate: float,
                 mean_in: float, mean_out: float) -> Estimate:
        key = (model, gpu_type, tp, round(arrival_rate, 9), mean_in, mean_out)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.calls += 1
        mspec, gspec = self._model(model), self._gpu(gpu_type)
        if not sim.fits(mspec, gspec, tp, min_kv_tokens=max(1, math.ceil(mean_in + mean_out))):
            est = Estimate(math.inf, 0.0, feasible=False, saturated=True)
            self._cache[key] = est
            return est
        rate = max(arrival_rate, 1e-6)
        window = min(self.horizon_s, max(self.max_requests / rate, 1.0 / rate * 20))
        rng = np.random.default_rng(self.seed)
        ins = self._lengths(mean_in, self.std_in.get(model, 0.0), 512, rng)
        outs = self._lengths(mean_out, self.std_out.get(model, 0.0), 512, rng)
        wl = sim.poisson(rate, window, ins, outs, self.seed)
        if len(wl) == 0:
            wl = sim.replay([(0.0, max(1, round(mean_in)), max(1, round(mean_out)))])
        res = sim.simulate_replica(mspec, gspec, tp, wl)
        saturated, thr = _saturation(res, arrival_rate)
        e2e = res.mean_e2e_s
        if saturated and window < self.horizon_s:
            e2e *= self.horizon_s / window  # queueing delay grows linearly with the window
        est = Estimate(e2e, thr, feasible=True, saturated=saturated,
                       mean_ttft_s=res.mean_ttft_s, mean_tpot_s=res.mean_tpot_s)
        self._cache[key] = est
        return est


def _saturation(res: sim.ServingResult, rate: float) -> tuple[bool, float]:
    """(saturated, throughput): saturated when the queue grows over the window, seen as the
    TTFT of the last quarter of arrivals well above the first quarter's; throughput is the
    offered rate, or the completion rate over the busy period when saturated."""
    if rate <= 0:
        return False, 0.0
    ttft = res.ttft_s
    n = ttft.size
    if n < 8:
        return False, rate
    q = n // 4
    first, last = np.nanmean(ttft[:q]), np.nanmean(ttft[-q:])
    if not last > 3.0 * first + 1.0:
        return False, rate
    finish = res.arrival_s + res.e2e_s
    busy = float(np.nanmax(finish) - np.min(res.arrival_s))
    return True, min(rate, res.n_completed / max(busy, 1e-9))
