"""Closed-loop load (`concurrency` clients, each sending its next request when the previous one
completes), as `vllm bench serve --max-concurrency C`, genai-perf/aiperf `--concurrency C`
and SGLang's `bench_serving --max-concurrency C` drive a server.

Two effects real runs have and a naive loop lacks:
- clients DRIFT APART. Identical clients that re-send the instant they finish stay in lockstep
  forever (they finish in the same step and re-arrive together), so every wave pays the whole
  first-wave queue. Worse, clusters are self-reinforcing: a long prefill step collects every
  request that arrives during it, so a delay shorter than a step does not break them. What
  does is a drift of a few STEPS: each request's output length is drawn uniformly from
  `output_tokens` -/+ `output_jitter_tokens` (mean kept; real clients drift by a few steps
  through stop handling, streaming and detokenization). Optionally each client also waits an
  exponential delay of mean `jitter_s` after a completion before sending again (outside
  TTFT: it happens before the send). Both are seeded;
- the FRONT END (tokenization, HTTP, streaming) adds `request_overhead_s` between the send and
  the engine's queue; that is inside TTFT and E2E.
The result reports steady-state means (`steady_ttft_s`, `steady_tpot_s`: the first wave of
`concurrency` requests excluded) beside the all-request means and the first wave's TTFT.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

import numpy as np

from llmfabric.sim.calibration import Efficiency
from llmfabric.sim.engine import EngineConfig, RequestBook
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.parallel import make_deployment
from llmfabric.sim.profiles import EngineProfile, get_profile
from llmfabric.sim.results import SLO, ServingResult, build_result
from llmfabric.sim.serving import ReplicaSpec, _replicas


@dataclass(frozen=True, slots=True, eq=False)
class ClosedLoopResult(ServingResult):
    """A ServingResult plus the closed loop's steady state (first wave excluded)."""

    concurrency: int
    steady_ttft_s: float  # mean TTFT of requests after the first `concurrency`
    steady_tpot_s: float
    first_wave_ttft_s: float  # mean TTFT of the first `concurrency` requests

    def summary(self) -> dict[str, float]:
        out = ServingResult.summary(self)
        for key in ("concurrency", "steady_ttft_s", "steady_tpot_s", "first_wave_ttft_s"):
            out[key] = float(getattr(self, key))
        return out


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def simulate_closed_loop(model: ModelSpec | str, gpu: GPUSpec | str, tp: int, concurrency: int,
                         n_requests: int, input_tokens: int, output_tokens: int, *,
                         pp: int = 1, engine_profile: str | EngineProfile = "vllm",
                         config: EngineConfig | None = None, jitter_s: float | None = None,
                         request_overhead_s: float | None = None,
                         output_jitter_tokens: float | None = None, seed: int = 0,
                         slo: SLO | None = None, efficiency: Efficiency | None = None
                         ) -> ClosedLoopResult:
    """`concurrency` clients against one replica of `model` on `pp` x `tp` x `gpu` until
    `n_requests` have been sent. `engine_profile` picks the engine's defaults (scheduling,
    batch limits, CPU costs, front-end latency and client drift; `profiles.PROFILES`);
    `config`, `jitter_s`, `request_overhead_s` and `output_jitter_tokens` override them.
    Arrival times in the result are the clients' send times; `seed` fixes the draws."""
    if concurrency < 1 or n_requests < 1:
        raise SpecError("closed loop needs concurrency >= 1 and n_requests >= 1")
    if input_tokens < 1 or output_tokens < 1:
        raise SpecError("closed loop needs input_tokens >= 1 and output_tokens >= 1")
    profile = get_profile(engine_profile)
    jitter = profile.client_jitter_s if jitter_s is None else jitter_s
    overhead = profile.request_overhead_s if request_overhead_s is None else request_overhead_s
    spread = (profile.output_jitter_tokens if output_jitter_tokens is None
              else output_jitter_tokens)
    if not (jitter >= 0 and overhead >= 0):
        raise SpecError("jitter_s and request_overhead_s must be >= 0 seconds")
    if not spread >= 0:
        raise SpecError("output_jitter_tokens must be >= 0")
    cfg = config or EngineConfig(**profile.config_kwargs())
    dep = make_deployment(get_model(model), get_gpu(gpu), tp, pp)
    rng = np.random.default_rng(seed)
    delays = (rng.exponential(jitter, n_requests) if jitter > 0
              else np.zeros(n_requests)).tolist()
    outs = np.full(n_requests, output_tokens, dtype=np.int64)
    if spread > 0:  # uniform in output_tokens -/+ spread (mean kept unless clipped at 1)
        draws = output_tokens + rng.uniform(-spread, spread, n_requests)
        outs = np.maximum(1, np.rint(draws)).astype(np.int64)
    out_list = outs.tolist()
    arrival = [0.0] * n_requests
    book = RequestBook(arrival, [input_tokens] * n_requests, out_list)
    (rep,) = _replicas([ReplicaSpec(dep, cfg, efficiency)], book)
    # (time the request reaches the engine, rid); its send time is `arrival[rid]`
    due: list[tuple[float, int]] = []
    sent = 0
    for _ in range(min(concurrency, n_requests)):
        arrival[sent] = delays[sent]
        heapq.heappush(due, (delays[sent] + overhead, sent))
        sent += 1
    outstanding: list[int] = []
    finish, truncated = book.finish, book.truncated
    while True:
        while due and due[0][0] <= rep.now:
            _, rid = heapq.heappop(due)
            rep.submit(rid, input_tokens, out_list[rid])
            outstanding.append(rid)
        progressed = rep.step_until(due[0][0] if due else math.inf)
        still = []
        for rid in outstanding:
            if math.isnan(finish[rid]) and not truncated[rid]:
                still.append(rid)
            elif sent < n_requests:
                done_at = finish[rid] if not math.isnan(finish[rid]) else rep.now
                arrival[sent] = done_at + delays[sent]
                heapq.heappush(due, (arrival[sent] + overhead, sent))
                sent += 1
        outstanding = still
        if not progressed:
            if not due:
                break
            rep.now = max(rep.now, due[0][0])  # idle until the next request reaches the engine
    # send times are not sorted by request id (clients drift), so no Workload here
    base = build_result(
        np.asarray(arrival, dtype=np.float64), np.full(n_requests, input_tokens, dtype=np.int64),
        outs, np.asarray(book.first_token, dtype=np.float64), np.asarray(finish, dtype=np.float64),
        np.asarray(truncated, dtype=bool), np.asarray(book.replica, dtype=np.int64),
        rep.preemptions, slo, [(rep.busy_start, rep.busy_end)])
    first = min(concurrency, n_requests)
    steady = slice(first, None) if n_requests > first else slice(0, None)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ServingResult)}
    return ClosedLoopResult(**fields, concurrency=concurrency,
                            steady_ttft_s=_mean(base.ttft_s[steady]),
                            steady_tpot_s=_mean(base.tpot_s[steady]),
                            first_wave_ttft_s=_mean(base.ttft_s[:first]))
