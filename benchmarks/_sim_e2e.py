"""End-to-end GPU-to-GPU speedup validation of the simulator (OpenTela Figure 8's definition).

OpenTela validates its simulator on END-TO-END latency of whole static batches, configurations
(input, output, batch) = (1024, 1024, 1), (2048, 512, 4), (512, 2048, 8), and reports the
error of the predicted H100-over-RTX-3090 speedup. We have no end-to-end measurements of our
own, but we have measured per-operator latencies on several GPUs (vidur: per-layer linear
operators on A100/H100/A40; aiconfigurator: prefill and decode attention kernels on A100/H100),
so the MEASURED end-to-end latency of a configuration is composed from them:

    T = n_layers x [ sum over prefill steps (LIN(k x input) + ATTN_PREFILL(k, input))
                     + sum over t = 1 .. output-1 (LIN(batch) + ATTN_DECODE(batch, input + t)) ]

- prefill: whole prompts, at most `budget` (4096, the measured grid's largest token count,
  as vLLM's max_num_batched_tokens) tokens per step, so (2048, 512, 4) prefills in two steps of
  two prompts; the prefill step samples the first output token;
- decode: output - 1 steps of `batch` tokens; in step t every sequence attends to input + t keys;
- LIN(m): per-layer sum of vidur's linear operators (norms, QKV, rope, o-proj, gate/up,
  activation, down, add) at m tokens, piecewise-linear interpolation in m on the measured grid;
- ATTN_PREFILL(k, isl): aiconfigurator's context-attention kernel at batch k and isl (exact
  grid points only: configurations off the grid are skipped, never extrapolated);
- ATTN_DECODE(b, keys): aiconfigurator's generation-attention kernel at batch b, piecewise-linear
  interpolation in the number of keys (step + 1) between its power-of-two grid points.

The SAME interpolation is used for every GPU. The prediction is exactly the same composition
with the simulator's own operator costs (`costs.op_time`, `costs.attention_time`, the shipped
per-GPU calibration, BF16, the same TP shard) evaluated at every exact token count / context.
TP collectives, embedding, LM head, sampling and scheduler overhead are left out of BOTH sides
(not in the operator profiles); n_layers cancels in a speedup.

GPUs without attention measurements (A40) are compared on a linear-only composition (attention
left out of both sides), reported separately: that is not an end-to-end latency.
"""

from __future__ import annotations

import csv
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmfabric.sim import Efficiency, GPUSpec, ModelSpec
from llmfabric.sim.costs import (
    attention_time,
    decode_extra_waves,
    decode_serial_kv_bytes,
    op_time,
)
from llmfabric.sim.operators import (
    attention_decode_ops,
    attention_prefill_ops,
    layer_linear_ops,
)

FloatArray = npt.NDArray[np.float64]

PAPER_CONFIGS = ((1024, 1024, 1), (2048, 512, 4), (512, 2048, 8))
EXTRA_CONFIGS = ((256, 256, 32), (1024, 128, 16), (4096, 256, 2))
DEFAULT_BUDGET = 4096
# Hugging Face config.json num_hidden_layers of the vidur-profiled models (only for absolute
# seconds and the memory check; a speedup does not depend on it).
N_LAYERS = {"Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "CodeLlama-34b-Instruct-hf": 48,
            "Qwen-72B": 80, "internlm-20b": 60, "Meta-Llama-3-8B": 32, "Meta-Llama-3-70B": 80}
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
MEMORY_UTILISATION = 0.9


class MissingMeasurement(LookupError):
    """The measured tables do not cover a configuration (it is skipped, never extrapolated)."""


@dataclass(frozen=True, slots=True)
class Config:
    input: int
    output: int
    batch: int

    @property
    def label(self) -> str:
        return f"({self.input},{self.output},{self.batch})"


@dataclass(frozen=True, slots=True)
class OpTables:
    """Per-layer operator latencies (seconds) of one model shard on one GPU.

    linear(m): all token-linear operators of one layer for a step of m tokens (vectorised);
    prefill_attn(k, isl): one fused attention kernel over k prompts of isl tokens;
    decode_attn(b, keys): one decode attention kernel, b sequences each attending to `keys`
    keys (vectorised over keys). None: attention not available (linear-only composition)."""

    linear: Callable[[FloatArray], FloatArray]
    prefill_attn: Callable[[int, int], float] | None = None
    decode_attn: Callable[[int, FloatArray], FloatArray] | None = None


def prefill_steps(cfg: Config, budget: int = DEFAULT_BUDGET) -> list[int]:
    """Prompts per prefill step: whole prompts, at most `budget` tokens a step (at least one)."""
    per_step = max(1, budget // cfg.input)
    full, rest = divmod(cfg.batch, per_step)
    return [per_step] * full + ([rest] if rest else [])


def compose(cfg: Config, tables: OpTables, n_layers: int, budget: int = DEFAULT_BUDGET,
            attention: bool = True) -> float:
    """End-to-end seconds of a static batch (see the module docstring for the formula)."""
    if min(cfg.input, cfg.output, cfg.batch, n_layers) < 1:
        raise ValueError(f"configuration {cfg} and n_layers={n_layers} must be positive")
    use_attn = attention and tables.prefill_attn is not None and tables.decode_attn is not None
    groups = prefill_steps(cfg, budget)
    total = float(np.sum(tables.linear(np.array([float(k * cfg.input) for k in groups]))))
    n_dec = cfg.output - 1
    if n_dec > 0:
        total += n_dec * float(tables.linear(np.array([float(cfg.batch)]))[0])
    if use_attn:
        assert tables.prefill_attn is not None and tables.decode_attn is not None
        total += sum(tables.prefill_attn(k, cfg.input) for k in groups)
        if n_dec > 0:
            keys = cfg.input + np.arange(1, n_dec + 1, dtype=np.float64)
            total += float(np.sum(tables.decode_attn(cfg.batch, keys)))
    return n_layers * total


# ---------------------------------------------------------------- measured tables


def interp_strict(x: FloatArray, xs: FloatArray, ys: FloatArray, what: str) -> FloatArray:
    """Piecewise-linear interpolation that refuses to extrapolate."""
    if x.size and (x.min() < xs[0] - 1e-9 or x.max() > xs[-1] + 1e-9):
        raise MissingMeasurement(f"{what}: {x.min():g}..{x.max():g} outside the measured "
                                 f"grid {xs[0]:g}..{xs[-1]:g}")
    return np.interp(x, xs, ys)


def vidur_linear_table(path: Path, tp: int, replace: dict[int, float] | None = None
                       ) -> tuple[ModelSpec, Callable[[FloatArray], FloatArray]]:
    """Per-layer linear-operator latency (s) of one vidur mlp.csv at one TP shard; `replace`:
    token count -> seconds that replace measured points (reference-data rule R1,
    `_sim_datarule.py`)."""
    with path.open() as fh:
        data = [r for r in csv.DictReader(fh) if int(r["num_tensor_parallel_workers"]) == tp]
    if not data:
        raise MissingMeasurement(f"{path} has no rows for tp={tp}")
    by_m: dict[int, float] = {}
    for r in data:
        by_m.setdefault(int(r["num_tokens"]),
                        sum(float(r[f"time_stats.{o}.median"]) for o in VIDUR_OPS) / 1e3)
    for m, seconds in (replace or {}).items():
        if m in by_m:
            by_m[m] = seconds
    xs = np.array(sorted(by_m), dtype=np.float64)
    ys = np.array([by_m[int(m)] for m in xs])
    r0 = data[0]
    heads, kv, hidden = int(r0["n_head"]), int(r0["n_kv_head"]), int(r0["n_embd"])
    spec = ModelSpec(name=path.parent.name, n_layers=N_LAYERS.get(path.parent.name, 1),
                     hidden=hidden, n_heads=heads, n_kv_heads=kv, head_dim=hidden // heads,
                     ffn_hidden=int(r0["n_expanded_embd"]), vocab=int(r0["vocab_size"]),
                     gated_mlp=r0["use_gated_mlp"] == "True")
    return spec, lambda m: interp_strict(m, xs, ys, f"{path.parent.name} tp{tp} tokens")


@dataclass(frozen=True, slots=True)
class AttentionData:
    """aiconfigurator BF16 attention medians (s) of one GPU, keyed by per-GPU heads."""

    context: dict[tuple[int, int, int], dict[tuple[int, int], float]]  # heads -> (b, isl) -> s
    generation: dict[tuple[int, int, int], dict[int, tuple[FloatArray, FloatArray]]]
    # heads -> batch -> (keys grid, seconds)

    def tables(self, heads: tuple[int, int, int]
               ) -> tuple[Callable[[int, int], float], Callable[[int, FloatArray], FloatArray]]:
        ctx = self.context.get(heads)
        gen = self.generation.get(heads)
        if not ctx or not gen:
            raise MissingMeasurement(f"no attention measurements for heads {heads}")

        def prefill(k: int, isl: int) -> float:
            if (k, isl) not in ctx:
                raise MissingMeasurement(f"no context attention at batch {k}, isl {isl}")
            return ctx[(k, isl)]

        def decode(b: int, keys: FloatArray) -> FloatArray:
            if b not in gen:
                raise MissingMeasurement(f"no generation attention at batch {b}")
            xs, ys = gen[b]
            return interp_strict(keys, xs, ys, f"decode attention heads {heads} batch {b}")

        return prefill, decode


def attention_data(records: Iterable[dict[str, object]], kind: str) -> AttentionData:
    """Build from aiconfigurator rows; `kind` is 'context' or 'generation' (one of them)."""
    samples: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for r in records:
        if r["kv_cache_dtype"] != "bfloat16" or int(r.get("window_size") or 0) != 0:  # type: ignore[call-overload]
            continue
        key = (int(r["num_heads"]), int(r["num_key_value_heads"]), int(r["head_dim"]),  # type: ignore[call-overload]
               int(r["batch_size"]), int(r["isl"] if kind == "context" else r["step"]))  # type: ignore[call-overload]
        samples[key].append(float(r["latency"]) / 1e3)  # type: ignore[arg-type]
    if kind == "context":
        ctx: dict[tuple[int, int, int], dict[tuple[int, int], float]] = defaultdict(dict)
        for (h, kv, d, b, isl), v in samples.items():
            ctx[(h, kv, d)][(b, isl)] = float(np.median(v))
        return AttentionData(dict(ctx), {})
    pts: dict[tuple[int, int, int], dict[int, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list))
    for (h, kv, d, b, step), v in samples.items():
        pts[(h, kv, d)][b].append((step + 1.0, float(np.median(v))))  # keys = step + 1
    gen = {heads: {b: (np.array([p[0] for p in sorted(v)]), np.array([p[1] for p in sorted(v)]))
                   for b, v in by_b.items()} for heads, by_b in pts.items()}
    return AttentionData({}, gen)


def per_gpu_heads(spec: ModelSpec, tp: int) -> tuple[int, int, int]:
    return -(-spec.n_heads // tp), max(1, -(-spec.n_kv_heads // tp)), spec.head_dim


# ---------------------------------------------------------------- simulator tables


def sim_tables(spec: ModelSpec, tp: int, gpu: GPUSpec, eff: Efficiency,
               warm_l2: bool = True) -> OpTables:
    """The simulator's own per-layer operator costs for the same composition. `warm_l2`
    (default): under the conditions of the measurements being composed, which repeat one
    kernel (aiconfigurator) or one layer (vidur) on the same data, so a working set that fits
    in L2 is cache-resident (`costs.memory_bandwidth`); False: serving (cold) costs."""
    ops = layer_linear_ops(spec, tp)
    h, kv, d = per_gpu_heads(spec, tp)
    shard = ModelSpec("shard", 1, h * d, h, kv, d, spec.ffn_hidden, spec.vocab)
    kv_token = 2.0 * kv * d * spec.kv_bits / 8
    serial = decode_serial_kv_bytes(shard, 1)  # > 0 for multi-head (group size 1) shards

    def linear(m: FloatArray) -> FloatArray:
        out = []
        for x in m:
            costs = [op.cost(int(x)) for op in ops]
            layer = sum(c.bytes for c in costs)  # the profiler repeats the whole layer
            out.append(sum(op_time(c, gpu, eff, warm_l2=warm_l2, working_set=layer)
                           for c in costs))
        return np.array(out)

    def prefill(k: int, isl: int) -> float:
        pre = attention_prefill_ops(shard, 1, isl, 0)
        one = attention_time(pre, gpu, eff, floor_flops=4.0 * h * d * isl, warm_l2=warm_l2,
                             working_set=k * sum(o.bytes for o in pre))
        return k * (one - eff.attention_overhead_s) + eff.attention_overhead_s

    def decode(b: int, keys: FloatArray) -> FloatArray:
        return np.array([attention_time(attention_decode_ops(shard, 1, b, b * float(n)), gpu,
                                        eff, floor_bytes=b * kv_token,
                                        serial_bytes=float(n) * serial, warm_l2=warm_l2,
                                        extra_waves=decode_extra_waves(gpu, b, kv))
                         for n in keys])

    return OpTables(linear, prefill, decode)


# ---------------------------------------------------------------- comparison


def fits(spec: ModelSpec, tp: int, cfg: Config, gpu: GPUSpec) -> bool:
    """Weights of the shard + the batch's KV within MEMORY_UTILISATION of the GPU memory."""
    weights = spec.n_layers * sum(op.weight_bytes for op in layer_linear_ops(spec, tp))
    weights += 2 * spec.vocab * spec.hidden * spec.weight_bits / 8 / tp
    _, kv, d = per_gpu_heads(spec, tp)
    kv_bytes = cfg.batch * (cfg.input + cfg.output) * spec.n_layers * 2 * kv * d * spec.kv_bits / 8
    return weights + kv_bytes <= MEMORY_UTILISATION * gpu.mem_bytes


@dataclass(frozen=True, slots=True)
class Latency:
    model: str
    tp: int
    config: Config
    gpu: str
    measured_s: float
    predicted_s: float
    attention: bool  # False: linear-only composition


def speedup_rows(latencies: list[Latency]) -> list[dict[str, object]]:
    """Every GPU pair measured for the same (model, tp, config, composition kind)."""
    by_key: dict[tuple[str, int, Config, bool], dict[str, Latency]] = defaultdict(dict)
    for lat in latencies:
        by_key[(lat.model, lat.tp, lat.config, lat.attention)][lat.gpu] = lat
    out: list[dict[str, object]] = []
    for (model, tp, cfg, attn), gpus in sorted(by_key.items(), key=lambda kv: (
            not kv[0][3], kv[0][0], kv[0][1], kv[0][2].label)):
        for a, b in itertools.combinations(sorted(gpus), 2):
            la, lb = gpus[a], gpus[b]
            meas = la.measured_s / lb.measured_s
            pred = la.predicted_s / lb.predicted_s
            out.append({"model": model, "tp": tp, "config": cfg.label,
                        "composition": "end-to-end" if attn else "linear-only",
                        "gpu_a": a, "gpu_b": b,
                        "measured_a_s": la.measured_s, "measured_b_s": lb.measured_s,
                        "predicted_a_s": la.predicted_s, "predicted_b_s": lb.predicted_s,
                        "measured_speedup_b_over_a": meas, "predicted_speedup_b_over_a": pred,
                        "error": abs(pred / meas - 1)})
    return out


def collect(vidur_root: Path, vidur_gpus: dict[str, GPUSpec], attention: dict[str, AttentionData],
            effs: dict[str, Efficiency], configs: Iterable[tuple[int, int, int]],
            tps: Iterable[int] = (1, 2, 4, 8), budget: int = DEFAULT_BUDGET,
            models: Iterable[str] | None = None, warm_l2: bool = True,
            replacements: dict[tuple[str, str, int, int], float] | None = None
            ) -> list[Latency]:
    """Measured and predicted latencies of every (vidur model, TP, config, GPU) that the data
    covers and that fits in the GPU's memory: an end-to-end composition where the GPU has
    attention measurements for the shard's heads, and always a linear-only one.

    vidur_gpus: vidur directory name -> GPU; attention: GPU name -> its aiconfigurator data;
    models: vidur model directory names to keep (default: all); warm_l2: see `sim_tables`;
    replacements: (GPU, vidur model directory, tp, m) -> per-layer linear seconds replacing
    measured points (reference-data rule R1, `_sim_datarule.py`)."""
    out: list[Latency] = []
    keep = set(models) if models is not None else None
    tps = tuple(tps)
    cfgs = [Config(*c) for c in configs]
    for gdir, gpu in vidur_gpus.items():
        for path in sorted((vidur_root / gdir).glob("*/*/mlp.csv")):
            with path.open() as fh:
                head = next(csv.DictReader(fh), None)
            if head is None or "time_stats.post_attention_layernorm.median" not in head:
                continue  # phi-2: parallel attention/MLP block, not this layer structure
            if path.parent.name not in N_LAYERS or (keep is not None
                                                      and path.parent.name not in keep):
                continue
            for tp in tps:
                try:
                    repl = {k[3]: v for k, v in (replacements or {}).items()
                            if k[:3] == (gpu.name, path.parent.name, tp)}
                    spec, lin = vidur_linear_table(path, tp, repl)
                except MissingMeasurement:
                    continue
                sim = sim_tables(spec, tp, gpu, effs[gpu.name], warm_l2)
                measured = OpTables(lin)
                if gpu.name in attention:
                    try:
                        pre, dec = attention[gpu.name].tables(per_gpu_heads(spec, tp))
                        measured = OpTables(lin, pre, dec)
                    except MissingMeasurement:
                        pass
                for cfg in cfgs:
                    if not fits(spec, tp, cfg, gpu):
                        continue
                    kinds = [False] + ([True] if measured.prefill_attn is not None else [])
                    for attn in kinds:
                        try:
                            meas = compose(cfg, measured, spec.n_layers, budget, attn)
                        except MissingMeasurement:
                            continue
                        pred = compose(cfg, sim, spec.n_layers, budget, attn)
                        out.append(Latency(spec.name, tp, cfg, gpu.name, meas, pred, attn))
    return out


def max_by_model(rows: list[dict[str, object]]) -> dict[str, float]:
    """Largest end-to-end speedup error of each model (all TPs, configs and GPU pairs)."""
    out: dict[str, float] = {}
    for r in rows:
        if r["composition"] == "end-to-end":
            key = str(r["model"])
            out[key] = max(out.get(key, 0.0), float(r["error"]))  # type: ignore[arg-type]
    return out


def summary(rows: list[dict[str, object]], paper_labels: Iterable[str]) -> dict[str, float]:
    """Maxima and means of the speedup errors: end-to-end (all / paper configs), linear-only."""
    paper = set(paper_labels)

    def pick(kind: str, only_paper: bool = False) -> list[float]:
        return [float(r["error"]) for r in rows  # type: ignore[arg-type]
                if r["composition"] == kind and (not only_paper or r["config"] in paper)]

    e2e, e2e_paper, lin = pick("end-to-end"), pick("end-to-end", True), pick("linear-only")
    return {"max_speedup_err_e2e": max(e2e, default=float("nan")),
            "mean_speedup_err_e2e": float(np.mean(e2e)) if e2e else float("nan"),
            "max_speedup_err_e2e_paper_configs": max(e2e_paper, default=float("nan")),
            "e2e_pairs": float(len(e2e)),
            "max_speedup_err_linear_only": max(lin, default=float("nan")),
            "mean_speedup_err_linear_only": float(np.mean(lin)) if lin else float("nan"),
            "linear_only_pairs": float(len(lin))}
