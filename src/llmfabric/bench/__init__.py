"""Load generator client: arrival processes, TTFT/TPOT/throughput, results (`llmfabric bench`).

Files -> concepts:
- `arrivals.py`: `ArrivalProcess` protocol and `ARRIVALS` registry: `Poisson(rate)`,
  `Gamma(rate, burstiness)`, `OnOff(low_rate, high_rate, low_s, high_s)` (Flying Serving
  bursts), `Replay(timestamps, time_scale)`.
- `workload.py`: `RequestSpec(offset_s, model, prompt, input_len, output_len)`,
  `synthetic_workload(...)`, `replay_workload(records, ...)`, synthetic prompts of N tokens and
  prompts rebuilt from trace hash ids (so replay keeps prefix sharing).
- `client.py`: `send(...)`, one streamed OpenAI request (aiohttp) timed per chunk ->
  `RequestOutcome` (ttft_s, itls_s, latency_s, tokens, error kind and the server's message).
- `runner.py`: `BenchConfig`, `run_load(specs, config, clock=..., on_sent=, on_done=)`:
  dispatch on schedule, concurrency cap, hard deadline.
- `metrics.py`: `summarize(outcomes, duration_s=, percentiles=, slo=SLO(...))` -> dict with
  `vllm bench serve` names (and `error_samples`: what the servers said, bounded and escaped);
  `detailed(outcomes)` per-request lists.
- `report.py`: `to_markdown(result)`, `write_results(result, json_path, markdown_path)`.
- `errors.py`: `BenchError` > `BenchConfigError`.

Example::

    specs = synthetic_workload(Poisson(5.0), model="m", input_len=256, output_len=64,
                               max_requests=200, max_duration_s=60)
    run = await run_load(specs, BenchConfig(base_url="http://127.0.0.1:8000"))
    result = summarize(run.outcomes, duration_s=run.duration_s, slo=SLO(ttft_ms=500))
"""

from llmfabric.bench.arrivals import ARRIVALS, ArrivalProcess, Gamma, OnOff, Poisson, Replay
from llmfabric.bench.client import RequestOutcome, send
from llmfabric.bench.errors import BenchConfigError, BenchError
from llmfabric.bench.metrics import SLO, detailed, summarize
from llmfabric.bench.report import to_markdown, write_results
from llmfabric.bench.runner import BenchConfig, RunOutcome, run_load
from llmfabric.bench.workload import (
    RequestSpec,
    prompt_from_hash_ids,
    replay_workload,
    synthetic_prompt,
    synthetic_workload,
)

__all__ = [
    "ARRIVALS",
    "SLO",
    "ArrivalProcess",
    "BenchConfig",
    "BenchConfigError",
    "BenchError",
    "Gamma",
    "OnOff",
    "Poisson",
    "Replay",
    "RequestOutcome",
    "RequestSpec",
    "RunOutcome",
    "detailed",
    "prompt_from_hash_ids",
    "replay_workload",
    "run_load",
    "send",
    "summarize",
    "synthetic_prompt",
    "synthetic_workload",
    "to_markdown",
    "write_results",
]
