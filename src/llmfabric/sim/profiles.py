"""Engine profiles: what vLLM, SGLang and TensorRT-LLM do by default, by name.

A profile fixes the scheduling policy (mixed chunked-prefill steps or prefill-first batches),
the default batch limits (max running sequences, token budget per step), the memory fraction
the engine claims, and the CPU cost of the engine around the GPU: a fixed cost per iteration
and a cost per running sequence per iteration (scheduling, input preparation, sampling,
detokenization), plus the serving front end's latency per request (tokenization, HTTP,
streaming: inside TTFT) and the desynchronization of closed-loop clients
(`output_jitter_tokens`: outputs drawn uniformly from OSL -/+ this many tokens, so clients
finish a few steps apart; `client_jitter_s`: the mean of an exponential delay between a
completion and that client's next send; see `closedloop`).

Batch limits are the engines' documented defaults (sources beside each profile); the KV cache
bounds the batch further at run time (the replica admits only what fits), so no profile caps
batches at a fixed 256. The CPU costs, the front-end latency and the jitter are FITTED on the
fit split of the measured end-to-end rows (`benchmarks/sim_e2e.py --fit`, docs/simulator.md
"Engine profiles"); they are properties of the engine build and host, not of the GPU. The
per-step CPU terms of vllm and trtllm were refitted (`--fit --fit-params
step_cpu_s,step_cpu_per_seq_s`) after FP8 GEMMs became shape-aware ("Third pass"): vllm 1.0 ->
0.5 ms, trtllm 0.5 -> 0 ms per step (the faster-than-real FP8 decode GEMMs had been hidden in
them); refitting the front-end and drift terms afterwards kept their values. The fourth
pass added `prompt_step_cpu_s` (CPU of an iteration that carries prompt tokens, beyond
`step_cpu_s`) and `whole_prompts`; both ship off (0 / False) in every profile: the fit rows
prefer trtllm 10 ms (objective 26.9 -> 26.1; 27.9 -> 26.3 on eight fresh seeds) and chunks,
but 10 ms did not transfer to the holdout (docs/simulator.md "Fourth pass").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmfabric.sim.errors import SpecError


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    # True: every step carries all decodes plus prompt chunks up to the token budget (vLLM v1,
    # TRT-LLM in-flight batching); False: prefill-first, a step runs prompts OR decodes
    chunked_prefill: bool
    max_num_seqs: int
    max_batched_tokens: int
    gpu_memory_utilization: float
    step_cpu_s: float  # per iteration
    step_cpu_per_seq_s: float  # per running sequence per iteration
    no_evict: bool  # reserve each request's whole output KV at admission (queue, not preempt)
    kv_fraction_of_free: float  # > 0: KV = this share of memory free after weights (TRT-LLM)
    request_overhead_s: float  # front end: from the client's send to the engine's queue
    client_jitter_s: float  # mean closed-loop client delay after a completion (not in TTFT)
    output_jitter_tokens: float  # closed-loop outputs uniform in OSL -/+ this (mean kept)
    source: str
    # mixed steps place prompts whole (no chunk beside another prompt): `EngineConfig`
    whole_prompts: bool = False
    prompt_step_cpu_s: float = 0.0  # extra CPU of a step carrying prompt tokens: `EngineConfig`

    def config_kwargs(self) -> dict[str, Any]:
        """The `EngineConfig` fields this profile sets."""
        keys = ("chunked_prefill", "max_num_seqs", "max_batched_tokens",
                "gpu_memory_utilization", "step_cpu_s", "step_cpu_per_seq_s", "no_evict",
                "kv_fraction_of_free", "whole_prompts", "prompt_step_cpu_s")
        values = asdict(self)
        return {k: values[k] for k in keys}


PROFILES: dict[str, EngineProfile] = {
    # vLLM v1 (0.8+): chunked prefill always on; each step schedules the running requests
    # first (one decode token each), then waiting prompts FCFS into the rest of the budget.
    # Defaults on GPUs with >= 70 GiB (not A100), OpenAI server: max_num_batched_tokens 8192,
    # max_num_seqs 1024 (vllm/engine/arg_utils.py, `get_batch_defaults`/`_set_default_args`);
    # gpu_memory_utilization 0.9.
    "vllm": EngineProfile(
        "vllm", chunked_prefill=True, max_num_seqs=1024, max_batched_tokens=8192,
        gpu_memory_utilization=0.9, step_cpu_s=0.5e-3, step_cpu_per_seq_s=4.0e-5, no_evict=False,
        kv_fraction_of_free=0.0,
        request_overhead_s=0.01, client_jitter_s=0.0, output_jitter_tokens=5.0,
        source="vllm/engine/arg_utils.py defaults (>= 70 GiB GPUs); v1 scheduler"),
    # SGLang (0.4-0.5): prefill-first; a prefill batch of waiting prompts (chunked_prefill_size
    # 8192 on 80 GB GPUs) runs without the decodes (enable_mixed_chunk off by default);
    # max_running_requests derived from the KV pool (capped here at 4096);
    # mem_fraction_static ~0.88 on 80 GB GPUs (sglang/srt/server_args.py).
    "sglang": EngineProfile(
        "sglang", chunked_prefill=False, max_num_seqs=4096, max_batched_tokens=8192,
        gpu_memory_utilization=0.88, step_cpu_s=0.0, step_cpu_per_seq_s=1.0e-5, no_evict=False,
        kv_fraction_of_free=0.0,
        request_overhead_s=0.03, client_jitter_s=0.0, output_jitter_tokens=0.0,
        source="sglang/srt/server_args.py defaults; scheduler prefill-first, no mixed chunk"),
    # TensorRT-LLM (trtllm-serve, PyTorch backend): in-flight batching mixes context and
    # generation requests in one step; max_num_tokens 8192, max_batch_size 2048,
    # kv_cache free_gpu_memory_fraction 0.9; capacity scheduler GUARANTEED_NO_EVICT (a request
    # is admitted only with KV for its whole output) (tensorrt_llm/llmapi/llm_args.py).
    # enable_chunked_prefill is off by default there (contexts scheduled whole:
    # `whole_prompts`), but on the fit rows whole prompts raise TTFT MAPE 20.0 -> 27.9 %
    # with the fitted drift (docs/simulator.md "Fourth pass"), so the profile keeps chunks.
    # CUDA graphs run generation-only batches; a step carrying a context runs eagerly
    # (`prompt_step_cpu_s`): the fit rows prefer 10 ms, but it made the holdout worse
    # (TTFT 40.8 -> 41.0 %, TPOT 12.4 -> 13.9 %), so it ships at 0 ("Fourth pass").
    "trtllm": EngineProfile(
        "trtllm", chunked_prefill=True, max_num_seqs=2048, max_batched_tokens=8192,
        gpu_memory_utilization=0.9, step_cpu_s=0.0, step_cpu_per_seq_s=4.0e-5, no_evict=True,
        kv_fraction_of_free=0.9,
        request_overhead_s=0.0, client_jitter_s=0.03, output_jitter_tokens=3.0,
        source="tensorrt_llm/llmapi/llm_args.py defaults; in-flight batching"),
    # The engine model before engine profiles (`EngineConfig()` defaults: vLLM V0-style
    # prefill-first, 256 sequences, no CPU terms) with identical clients that never drift:
    # the baseline of the e2e benchmark and the set-up of sim_accuracy's published rows.
    "plain": EngineProfile(
        "plain", chunked_prefill=False, max_num_seqs=256, max_batched_tokens=8192,
        gpu_memory_utilization=0.9, step_cpu_s=0.0, step_cpu_per_seq_s=0.0, no_evict=False,
        kv_fraction_of_free=0.0,
        request_overhead_s=0.0, client_jitter_s=0.0, output_jitter_tokens=0.0,
        source="llmfabric's EngineConfig() defaults"),
}

_ALIASES = {"vllm-v1": "vllm", "sgl": "sglang", "sg-lang": "sglang", "tensorrt-llm": "trtllm",
            "tensorrt_llm": "trtllm", "trt-llm": "trtllm", "trt": "trtllm"}


def get_profile(name: str | EngineProfile) -> EngineProfile:
    """A profile by name ("vllm", "sglang", "trtllm"; case-insensitive, common aliases)."""
    if isinstance(name, EngineProfile):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PROFILES:
        raise SpecError(f"unknown engine profile {name!r}; use one of {sorted(PROFILES)}")
    return PROFILES[key]
