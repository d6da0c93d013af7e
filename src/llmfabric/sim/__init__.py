"""Serving simulator: hardware/model specs, roofline operator costs, discrete-event serving.

No GPU needed, no wall clock, no I/O except reading spec/trace files you name.

Files -> concepts
- hardware.py     GPUSpec table (dense FLOP/s per dtype, HBM, L2, SMs, interconnect, price),
                  immutable `GPUCatalog` with forgiving name lookup (`get_gpu`); user GPUs
                  from YAML: `load_gpus_yaml` returns a new catalog to pass on explicitly.
- gpu_names.py    GPU names as routing and the agent compare/publish them (`catalog_name`,
                  `gpu_matches`: exact catalog name/alias or family token, never a substring).
- models.py       ModelSpec presets and Hugging Face config.json parsing (`get_model`).
- operators.py    per-layer FLOPs/bytes of every operator (LLM-Viewer style), per GPU under TP.
- calibration.py  Efficiency factors (compute/memory/overheads) per GPU, fitted on measurements;
                  shape-aware low-precision GEMMs (`ShapedLowPrecision`).
- costs.py        roofline step costs, tabulated per deployment: `prefill_time`,
                  `decode_step_time`, `cost_model` -> StepCostModel (decode attention wave
                  latency W(B); warm-L2 reads only for predicting microbenchmarks).
- collectives.py  tensor-parallel all-reduce cost, fitted on measured collectives per GPU class.
- parallel.py     alpha-beta links, ring all-reduce, KV transfer (quantization metadata;
                  per-stage `kv_transfer_time_staged`), `Deployment` (pipeline stages of
                  (GPU, TP, layers), per-stage all-reduce models, per-boundary PP links),
                  `balanced_layer_split` (water-filled under layer caps).
- topology.py     network graph (GPUs, switches; NVLink/PCIe/Ethernet/WAN edges with capacity
                  and latency; YAML), shortest/widest paths, `pair_link`, `bandwidth_matrix`;
                  generators `fat_tree_tracks` (HeroServe) and `cloud_instances` (ThunderServe).
- netsim.py       flow-level network simulator: flows on paths over full-duplex links, max-min
                  fair sharing (progressive filling), event driven; link utilisation over time.
- linkmatrix.py   LinkMatrix: one Link per (prefill, decode) replica pair or GPU pair; CSV
                  loader (GB/s or Gbps), `from_topology`, `reduce` to replica pairs.
- layersplit.py   memory-aware layer splits: per-stage layer caps that keep KV room,
                  `memory_aware_layers` / `memory_aware_deployment`.
- memory.py       weight/KV bytes, KV capacity, `fits`, `max_kv_tokens`, `plan_memory`.
- workload.py     arrivals: poisson, gamma (bursty), on_off, replay, load_trace; prefix groups
                  (`with_prefixes`) for prefix-aware routing.
- prefix_cache.py BlockLRU (prefix cache over chain-named KV blocks, the engine's capacity)
                  and PrefixEngine (FCFS prefill that skips cached blocks) for routing studies.
- engine.py       one replica: vLLM-style continuous batching at iteration granularity
                  (admission, chunked prefill, preemption by recompute, no-evict admission,
                  engine CPU time per step), closed-form stretches; `EngineConfig.for_engine`;
                  drain-free `Replica.set_role`, `pause`/`resume`.
- pipeline.py     pipelined PP (`EngineConfig.pp_microbatch`): per-stage step costs, micro-batches
                  overlapping across stages (step = PP x slowest stage; one sequence: the sum).
- pdrouting.py    PDRouting(x, y): fixed prefill/decode fractions by smooth weighted round
                  robin (seeded, deterministic); KV link resolution and per-link FIFO contention.
- profiles.py     engine profiles by name (vllm, sglang, trtllm, plain): scheduling policy,
                  batch limits, KV memory, fitted CPU / front-end / client-drift terms.
- closedloop.py   `simulate_closed_loop`: concurrency-bound clients that drift apart (seeded),
                  ClosedLoopResult with steady-state (first wave excluded) TTFT/TPOT.
- e2e.py          replay measured end-to-end rows (CSV) through closed loops: predicted vs
                  measured TTFT/TPOT, MAPE overall / per GPU / per backend.
- e2e_correction.py  optional residual layer on the replay: per-backend log-linear factor in
                  (ln c, ln ISL, ln OSL, ln TP) fitted by ridge least squares on rows given;
                  leave-one-group-out evaluation.
- routers.py      router policies by name (ROUTERS); names shared with routing.policies mean
                  the same policy (random, round_robin, weighted, least_outstanding = power of
                  two choices, prefix_affinity); plus prefix_bounded_load (eps), prefix_hash,
                  join_shortest_queue, least_work, power_of_two.
- serving.py      `simulate_replica`, `simulate_cluster`, `simulate_disaggregated`,
                  `max_sustainable_rate`.
- results.py      ServingResult (TTFT/TPOT/E2E per request, throughput, SLO attainment,
                  utilisation over time), SLO.
- switching.py    Flying Serving's pure DP <-> TP switching policies (SwitchState ->
                  Bind/Release, SWITCH_POLICIES by name); re-exported by scheduler/switching.py;
                  shared by flying.py, the simulated engine and engines/torchref.
- flying.py       `simulate_flying` (DP engines binding into TP groups under a switching
                  policy; FlyingResult with the mode timeline), `max_context_tokens`,
                  `burst_trace` (low load alternating with bursts).
- errors.py       SimError hierarchy; naming_file and not_utf8 (one wording for file errors).

Stable API (used by engines/ and scheduler/):

    gpu = get_gpu("H100-SXM"); model = get_model("llama-3.1-8b")
    prefill_time(model, gpu, tp, n_tokens, batch=1, *, pp=1) -> seconds
    decode_step_time(model, gpu, tp, batch_size, mean_context, *, pp=1) -> seconds
    cost_model(model, gpu, tp=1, pp=1) -> StepCostModel   # cached; .decode_step_time(b, S)...
    fits(model, gpu, tp=1, pp=1, *, min_kv_tokens=None) -> bool
    plan_memory(model, gpu, tp=1, pp=1) -> MemoryPlan   # weight/KV bytes, kv_capacity_tokens
    max_kv_tokens(model, gpu, tp=1, pp=1) -> int;  weight_bytes(model) -> float
    simulate_replica(model, gpu, tp, workload, *, pp=1, config=EngineConfig(), slo=None)
        -> ServingResult (mean_e2e_s, mean_ttft_s, mean_tpot_s, throughput_rps,
           slo_attainment, p99_*, per-request arrays, utilisation)
    simulate_cluster([ReplicaSpec.of(model, gpu, tp), ...], workload, router=...)
    simulate_disaggregated(prefill_specs, decode_specs, workload, link | LinkMatrix, *,
        routing=PDRouting(x, y), kv_bits=4, kv_group=64, link_contention=False)
    Topology / fat_tree_tracks / cloud_instances (sim.topology): pair_link, bandwidth_matrix
    simulate_closed_loop(model, gpu, tp, concurrency, n_requests, input_tokens, output_tokens,
                         engine_profile="vllm") -> ClosedLoopResult (steady_ttft_s, ...)
    EngineConfig.for_engine("sglang", **overrides);  e2e.replay("rows.csv") -> dict
    max_sustainable_rate(model, gpu, tp, input_tokens, output_tokens, SLO(...)) -> req/s
    poisson(rate, duration, input_tokens, output_tokens, seed) -> Workload (also gamma,
        on_off, replay, load_trace)
"""

from llmfabric.sim.calibration import DEFAULT_EFFICIENCY, Efficiency, efficiency_for
from llmfabric.sim.closedloop import ClosedLoopResult, simulate_closed_loop
from llmfabric.sim.costs import StepCostModel, cost_model, decode_step_time, prefill_time
from llmfabric.sim.engine import EngineConfig
from llmfabric.sim.errors import (
    InfeasibleError,
    SimError,
    SpecError,
    UnknownGPUError,
    UnknownModelError,
    WorkloadError,
)
from llmfabric.sim.hardware import (
    DEFAULT_CATALOG,
    GPUCatalog,
    GPUSpec,
    get_gpu,
    load_gpus_yaml,
    read_gpus_yaml,
)
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.memory import MemoryPlan, fits, max_kv_tokens, plan_memory, weight_bytes
from llmfabric.sim.models import ModelSpec, get_model, model_from_hf_config
from llmfabric.sim.parallel import (
    Deployment,
    Link,
    Stage,
    allreduce_time,
    balanced_layer_split,
    kv_transfer_bytes,
    kv_transfer_time,
    kv_transfer_time_staged,
    make_deployment,
)
from llmfabric.sim.pdrouting import PDRouting
from llmfabric.sim.profiles import PROFILES, EngineProfile, get_profile
from llmfabric.sim.results import SLO, ServingResult
from llmfabric.sim.routers import ROUTERS
from llmfabric.sim.serving import (
    ReplicaSpec,
    max_sustainable_rate,
    simulate_cluster,
    simulate_disaggregated,
    simulate_replica,
)
from llmfabric.sim.topology import Topology, cloud_instances, fat_tree_tracks
from llmfabric.sim.workload import Workload, gamma, load_trace, on_off, poisson, replay

__all__ = [
    "DEFAULT_CATALOG",
    "DEFAULT_EFFICIENCY",
    "PROFILES",
    "ROUTERS",
    "SLO",
    "ClosedLoopResult",
    "Deployment",
    "Efficiency",
    "EngineConfig",
    "EngineProfile",
    "GPUCatalog",
    "GPUSpec",
    "InfeasibleError",
    "Link",
    "LinkMatrix",
    "MemoryPlan",
    "ModelSpec",
    "PDRouting",
    "ReplicaSpec",
    "ServingResult",
    "SimError",
    "SpecError",
    "Stage",
    "StepCostModel",
    "Topology",
    "UnknownGPUError",
    "UnknownModelError",
    "Workload",
    "WorkloadError",
    "allreduce_time",
    "balanced_layer_split",
    "cloud_instances",
    "cost_model",
    "decode_step_time",
    "efficiency_for",
    "fat_tree_tracks",
    "fits",
    "gamma",
    "get_gpu",
    "get_model",
    "get_profile",
    "kv_transfer_bytes",
    "kv_transfer_time",
    "kv_transfer_time_staged",
    "load_gpus_yaml",
    "load_trace",
    "make_deployment",
    "max_kv_tokens",
    "max_sustainable_rate",
    "model_from_hf_config",
    "on_off",
    "plan_memory",
    "poisson",
    "prefill_time",
    "read_gpus_yaml",
    "replay",
    "simulate_closed_loop",
    "simulate_cluster",
    "simulate_disaggregated",
    "simulate_replica",
    "weight_bytes",
]
