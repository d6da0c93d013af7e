"""Roofline step costs for one replica, cached per deployment.

`StepCostModel` turns the operator accounting of `operators.py` into seconds for an engine
iteration. Everything that depends only on the number of tokens in the step is tabulated once
(numpy) for m = 0..table_tokens, so the serving loop pays a list index per step:

    step(m tokens, n sampled sequences, decode context S, prefill chunks)
      = LIN[m] + HEAD[n] + G(B)*S + Q*B + W(B) + sum_chunks attn_prefill(chunk, prefix)
        + overhead      (B = n_decode)

LIN covers all layers' linear operators (sharded), TP all-reduces (`collectives`: fitted
alpha-beta regimes per GPU class, the ring formula over the stage's link otherwise) and
activation transfers between pipeline stages; HEAD is embedding-independent LM head work;
G/Q are decode-attention coefficients (per cached token / per sequence); W(B) is the
decode-attention latency of thread-block waves beyond the first (a function of B only, so
decode stretches keep their closed form). Pipeline stages run one after another for a single
batch (latency = sum of stages).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.sim.calibration import (
    Efficiency,
    ShapedLowPrecision,
    efficiency_for,
    roofline,
    warm_read_factor,
)
from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.operators import (
    FloatArray,
    LinearOp,
    OpCost,
    attention_decode_ops,
    embedding_op,
    heads_per_gpu,
    layer_linear_ops,
    lm_head_op,
    tp_allreduce_bytes_per_token,
)
from llmfabric.sim.parallel import Deployment, make_deployment

DEFAULT_TABLE_TOKENS = 16384
DECODE_BATCH_TABLE = 4096  # G(B) is tabulated up to this batch; larger batches use G


def memory_bandwidth(gpu: GPUSpec, eff: Efficiency, working_set: float = 0.0,
                     warm_l2: bool = False) -> float:
    """Achieved bytes/s of a streaming read. Serving (the default) reads from HBM at
    `mem_bw x memory`. `warm_l2=True` models a microbenchmark that repeats one kernel (or one
    layer) on the same data: the share of its `working_set` still L2-resident from the
    previous repetition (`calibration.l2_hit_fraction`, smooth in the working set) is read
    `l2_speedup` times faster. In serving the same bytes were last touched a whole model step
    earlier (GBs of other weights and KV in between), so they are not resident and the engine
    never passes it."""
    bw = gpu.mem_bw * eff.memory
    if warm_l2 and eff.l2_speedup > 1.0:
        return bw / warm_read_factor(working_set, gpu.l2_bytes, eff)
    return bw


def op_time(op: OpCost, gpu: GPUSpec, eff: Efficiency, dtype_bits: int = 16, *,
            warm_l2: bool = False, working_set: float | None = None) -> float:
    """Roofline time of one operator: R(compute, memory) + kernel overhead. `warm_l2`: see
    `memory_bandwidth` (`working_set` defaults to the operator's own bytes)."""
    peak = gpu.flops(dtype_bits) * eff.compute if op.tensor else gpu.fp32_flops * eff.vector
    if op.tensor and dtype_bits <= 8:
        peak *= eff.low_precision_compute
    ws = op.bytes if working_set is None else working_set
    bw = memory_bandwidth(gpu, eff, ws, warm_l2)
    return float(roofline(op.flops / peak, op.bytes / bw, eff.roofline_p)) + eff.kernel_overhead_s


def attention_time(ops: tuple[OpCost, ...], gpu: GPUSpec, eff: Efficiency,
                   dtype_bits: int = 16, floor_flops: float = 0.0,
                   floor_bytes: float = 0.0, serial_bytes: float = 0.0, *,
                   warm_l2: bool = False, working_set: float | None = None,
                   extra_waves: int = 0) -> float:
    """One fused attention kernel: matmul FLOPs (+ `floor_flops` x the prefill key floor: the
    FLOPs of one key for every query row) at the attention efficiency, all bytes moved
    (+ `floor_bytes` x the decode key floor: one token's KV for every sequence), softmax
    overlapped, plus the attention kernel overhead. `serial_bytes`: the K/V bytes ONE thread
    block streams when the kernel does not split the KV sequence (MHA decode, see
    `Efficiency.decode_cta_bw`); the memory time is at least serial_bytes x waves /
    decode_cta_bw.
    `warm_l2`: a microbenchmark repeating this kernel on the same Q/K/V (`memory_bandwidth`;
    `working_set` defaults to the bytes of `ops`). `extra_waves`: thread-block waves beyond the
    first (decode, `decode_extra_waves`), each costing `decode_wave_s`."""
    mm = sum(op.flops for op in ops if op.tensor) + floor_flops * eff.attention_key_floor
    data = sum(op.bytes for op in ops)
    moved = data + floor_bytes * eff.decode_key_floor
    compute = mm / (gpu.flops(dtype_bits) * eff.attention)
    ws = data if working_set is None else working_set
    memory = moved / memory_bandwidth(gpu, eff, ws, warm_l2)
    if eff.decode_cta_bw > 0 and serial_bytes > 0:  # each wave of blocks streams in turn
        memory = max(memory, serial_bytes * (1 + extra_waves) / eff.decode_cta_bw)
    nosplit = eff.decode_cta_bw > 0 and serial_bytes > 0
    overhead = eff.nosplit_overhead_s() if nosplit else eff.attention_overhead_s
    return (float(roofline(compute, memory, eff.roofline_p)) + overhead
            + eff.decode_wave_s * extra_waves)


def decode_extra_waves(gpu: GPUSpec, batch: int, kv_heads: int) -> int:
    """Waves beyond the first of a decode attention kernel that runs one thread block per
    (sequence, KV head) on `gpu.sm_count` SMs (0 when the SM count is unknown)."""
    if gpu.sm_count <= 0 or batch <= 0:
        return 0
    return max(0, -(-(batch * kv_heads) // gpu.sm_count) - 1)


def _extra_waves_array(gpu: GPUSpec, batches: FloatArray, kv_heads: int
                       ) -> npt.NDArray[np.int64]:
    """`decode_extra_waves` for every batch in `batches` at once (same integers)."""
    b = batches.astype(np.int64)
    if gpu.sm_count <= 0:
        return np.zeros_like(b)
    waves = np.maximum(0, -(-(b * kv_heads) // gpu.sm_count) - 1)
    waves[b <= 0] = 0
    return waves


def decode_serial_kv_bytes(model: ModelSpec, tp: int) -> float:
    """K/V bytes per cached token that one thread block of a non-split decode kernel streams
    (one KV head), or 0 when the shard has grouped queries (the kernel splits the KV then)."""
    nh, nkv = heads_per_gpu(model, tp)
    if nh > nkv:
        return 0.0
    return 2.0 * model.head_dim * model.kv_bits / 8


def low_precision_gemm_time(shaped: ShapedLowPrecision, flops_per_token: float,
                            m: FloatArray, n: int, k: int, peak: float) -> FloatArray:
    """Compute time of a low-precision GEMM of known shape: the FLOPs of the tile-padded m at
    `peak` (GPU peak x `compute`) x the shape's share (`ShapedLowPrecision`)."""
    share = shaped.share(m, n, k)
    mp = shaped.padded(m)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(share > 0, flops_per_token * mp / (peak * share), 0.0)
    return np.asarray(t, dtype=np.float64)


def _linear_times(ops: tuple[LinearOp, ...], m: FloatArray, gpu: GPUSpec, eff: Efficiency,
                  dtype_bits: int) -> FloatArray:
    total = np.zeros_like(m)
    bw = gpu.mem_bw * eff.memory
    tensor_peak = gpu.flops(dtype_bits) * eff.compute
    if dtype_bits <= 8:
        tensor_peak *= eff.low_precision_compute
    shaped = eff.low_precision_shaped if dtype_bits <= 8 else None
    for op in ops:
        peak = tensor_peak if op.tensor else gpu.fp32_flops * eff.vector
        if shaped is not None and op.tensor and op.gemm_k > 0 and op.gemm_n > 0:
            compute = low_precision_gemm_time(shaped, op.flops_per_token, m, op.gemm_n,
                                              op.gemm_k, gpu.flops(dtype_bits) * eff.compute)
        else:
            compute = op.flops_per_token * m / peak
        memory = (op.weights_touched(m) + op.act_bytes_per_token * m) / bw
        total += roofline(compute, memory, eff.roofline_p) + eff.kernel_overhead_s
    return total


@dataclass(frozen=True, slots=True)
class _StageCoeffs:
    gpu: GPUSpec
    eff: Efficiency
    tp: int
    n_layers: int
    dtype_bits: int


@dataclass(frozen=True, slots=True, eq=False)
class StepCostModel:
    """Per-iteration cost of one replica. Build with `cost_model(...)` (cached)."""

    deployment: Deployment
    lin: FloatArray  # seconds for m tokens through all layers (+ comm), index m
    head: FloatArray  # seconds for the LM head of n sequences, index n
    decode_per_context_token: float  # G (for a large batch)
    decode_per_sequence: float  # Q
    step_overhead_s: float
    stages: tuple[_StageCoeffs, ...]
    # per stage: (layers, s per attended pair, s per query token, s per cached token, p,
    # key floor per query)
    attn_coeffs: tuple[tuple[float, float, float, float, float, float], ...]
    # G(B) for B = 0..len-1 decoding sequences (differs from G only for non-split MHA decode)
    decode_context_by_batch: FloatArray = dataclasses.field(
        default_factory=lambda: np.zeros(0))
    # W(B): decode attention wave latency of B decoding sequences, all layers (index B)
    decode_wave_by_batch: FloatArray = dataclasses.field(default_factory=lambda: np.zeros(0))
    # decode-only steps of non-split kernels: their fixed latency minus the attention overhead
    # that `lin` carries for every step (all layers; <= 0)
    decode_overhead_adjust_s: float = 0.0

    def decode_context_coeff(self, batch: int) -> float:
        """Seconds per cached token of a decode step with `batch` sequences (G(B))."""
        if batch < len(self.decode_context_by_batch):
            return float(self.decode_context_by_batch[batch])
        return self.decode_per_context_token

    def decode_wave_time(self, batch: int) -> float:
        """Seconds of decode-attention thread-block waves beyond the first (W(B), all layers)."""
        if batch < len(self.decode_wave_by_batch):
            return float(self.decode_wave_by_batch[batch])
        return _wave_time(self.deployment.model, self.stages, batch)

    @property
    def model(self) -> ModelSpec:
        return self.deployment.model

    def linear_time(self, m: int) -> float:
        if m < len(self.lin):
            return float(self.lin[m])
        return float(_lin_table(self.deployment, self.stages, np.array([float(m)]))[0])

    def head_time(self, n: int) -> float:
        if n < len(self.head):
            return float(self.head[n])
        return float(_head_table(self.deployment, self.stages, np.array([float(n)]))[0])

    def attention_prefill_time(self, chunk: int, prefix: int = 0) -> float:
        """Attention (score, softmax, value) of one sequence's prefill chunk, all layers.
        Kernel launch overheads are already in `lin` (once per layer per step)."""
        if chunk <= 0:
            return 0.0
        pairs = chunk * (prefix + (chunk + 1) * 0.5)
        total = 0.0
        for n_layers, c_mm, c_q, c_kv, p, floor in self.attn_coeffs:
            mem = c_q * chunk + c_kv * (prefix + chunk)
            mm = c_mm * (pairs + floor * chunk)
            if p <= 0:
                total += n_layers * (mm if mm > mem else mem)
            else:
                total += n_layers * (mm**p + mem**p) ** (1.0 / p)
        return total

    def decode_step_time(self, batch: int, total_context: float) -> float:
        """One decode iteration: `batch` sequences, `total_context` cached tokens in all."""
        if batch <= 0:
            return 0.0
        return (self.linear_time(batch) + self.head_time(batch)
                + self.decode_per_sequence * batch + self.decode_wave_time(batch)
                + self.decode_context_coeff(batch) * total_context + self.step_overhead_s
                + self.decode_overhead_adjust_s)

    def prefill_time(self, prompt_lens: list[int] | tuple[int, ...]) -> float:
        """One prefill-only iteration over whole prompts (no cached prefix)."""
        if not prompt_lens:
            return 0.0
        m = sum(prompt_lens)
        attn = 0.0
        for p in prompt_lens:
            attn += self.attention_prefill_time(p)
        return self.linear_time(m) + self.head_time(len(prompt_lens)) + attn + self.step_overhead_s

    def mixed_step_time(self, n_decode: int, decode_context: float,
                        chunks: list[tuple[int, int]], n_sampled: int) -> float:
        """A chunked-prefill iteration: `n_decode` decoding sequences plus prefill `chunks`
        (chunk tokens, cached prefix) of which `n_sampled` finish their prompt this step."""
        m = n_decode + sum(c for c, _ in chunks)
        if m <= 0:
            return 0.0
        attn = sum(self.attention_prefill_time(c, p) for c, p in chunks)
        if not chunks:  # decode only: the decode kernel's own fixed latency
            attn += self.decode_overhead_adjust_s
        return (self.linear_time(m) + self.head_time(n_decode + n_sampled) + attn
                + self.decode_per_sequence * n_decode + self.decode_wave_time(n_decode)
                + self.decode_context_coeff(n_decode) * decode_context + self.step_overhead_s)


def _lin_table(dep: Deployment, stages: tuple[_StageCoeffs, ...], m: FloatArray) -> FloatArray:
    model = dep.model
    total = np.zeros_like(m)
    ar_bytes = tp_allreduce_bytes_per_token(model) / 2  # per all-reduce
    for i, st in enumerate(stages):
        total += _layer_table(model, st, m) * st.n_layers
        if st.tp > 1:
            total += 2 * st.n_layers * dep.stage_allreduce(i).times(ar_bytes * m, st.tp)
        if i == 0:
            total += _layer_table(model, st, m, "embedding")
    act = model.hidden * model.act_bits / 8
    for boundary in range(dep.pp - 1):
        link = dep.stage_pp_link(boundary)
        total += link.latency_s + act * m / link.bandwidth
    return total


_LAYER_TABLES: OrderedDict[tuple[object, ...], FloatArray] = OrderedDict()  # LRU
_LAYER_TABLES_MAX = 256


def _layer_table(model: ModelSpec, st: _StageCoeffs, m: FloatArray,
                 kind: str = "layer") -> FloatArray:
    """The linear-op times of one layer ("layer"), the embedding or the LM head over the
    token grid `m` (0..n); shared by every deployment with a stage of this GPU, TP and
    calibration (planners build hundreds of deployments from a few stage kinds)."""
    # keyed by the model's shape only: PP sub-models differ in name and layer count alone
    shape = dataclasses.replace(model, name="", n_layers=1, aliases=())
    key = (kind, shape, st.tp, st.gpu, st.eff, st.dtype_bits, len(m), float(m[-1]))
    got = _LAYER_TABLES.get(key)
    if got is not None:
        _LAYER_TABLES.move_to_end(key)
    else:
        ops = (layer_linear_ops(model, st.tp) if kind == "layer"
               else (embedding_op(model),) if kind == "embedding"
               else (lm_head_op(model, st.tp),))
        got = _linear_times(ops, m, st.gpu, st.eff, st.dtype_bits)
        got.setflags(write=False)
        if len(m) > 1:  # one-point grids (out-of-table look-ups) are cheap: not kept
            _LAYER_TABLES[key] = got
            if len(_LAYER_TABLES) > _LAYER_TABLES_MAX:
                _LAYER_TABLES.popitem(last=False)
    return got


def _wave_table(model: ModelSpec, stages: tuple[_StageCoeffs, ...], batches: FloatArray
                ) -> FloatArray:
    """`_wave_time` for every batch in `batches` (same sums, in the same stage order)."""
    total = np.zeros_like(batches)
    for st in stages:
        if st.eff.decode_wave_s > 0:
            waves = _extra_waves_array(st.gpu, batches, heads_per_gpu(model, st.tp)[1])
            total += st.n_layers * st.eff.decode_wave_s * waves
    return total


def _wave_time(model: ModelSpec, stages: tuple[_StageCoeffs, ...], batch: int) -> float:
    total = 0.0
    for st in stages:
        if st.eff.decode_wave_s > 0:
            waves = decode_extra_waves(st.gpu, batch, heads_per_gpu(model, st.tp)[1])
            total += st.n_layers * st.eff.decode_wave_s * waves
    return total


def _head_table(dep: Deployment, stages: tuple[_StageCoeffs, ...], n: FloatArray) -> FloatArray:
    last = stages[-1]
    head = _layer_table(dep.model, last, n, "head").copy()
    head[n <= 0] = 0.0
    if last.tp > 1:  # gather of vocab-sharded logits: about half an all-reduce
        per_seq = 4 * dep.model.vocab / last.tp
        gather = dep.stage_allreduce(dep.pp - 1).times(per_seq * n, last.tp) / 2
        head += np.where(n > 0, gather, 0.0)
    return head


def build_cost_model(dep: Deployment, efficiency: Efficiency | None = None,
                     table_tokens: int = DEFAULT_TABLE_TOKENS) -> StepCostModel:
    """Tabulate the step costs of `dep`; `efficiency` overrides the per-GPU calibration."""
    model = dep.model
    bits = model.matmul_bits
    attn_bits = max(bits, 8)  # FP4 GEMMs; attention runs FP8 at the narrowest
    stages = tuple(
        _StageCoeffs(s.gpu, efficiency or efficiency_for(s.gpu), s.tp, s.n_layers, bits)
        for s in dep.stages
    )
    m = np.arange(table_tokens + 1, dtype=np.float64)
    lin = _lin_table(dep, stages, m)
    # one fused attention kernel (FlashAttention) per layer per step
    lin[1:] += sum(st.eff.attention_overhead_s * st.n_layers for st in stages)
    lin[0] = 0.0
    head = _head_table(dep, stages, m)
    g = 0.0
    q = 0.0
    coeffs = []
    batches = np.arange(DECODE_BATCH_TABLE + 1, dtype=np.float64)
    g_by_batch = np.zeros_like(batches)
    for st in stages:
        # decode: 1 query per sequence; score+value FLOPs and K/V bytes per cached token
        one = attention_decode_ops(model, st.tp, 1, 1.0)
        zero = attention_decode_ops(model, st.tp, 1, 0.0)
        peak = st.gpu.flops(attn_bits) * st.eff.attention
        bw = st.gpu.mem_bw * st.eff.memory
        mm_tok = sum(a.flops - b.flops for a, b in zip(one, zero, strict=True) if a.tensor)
        kv_tok = sum(a.bytes - b.bytes for a, b in zip(one, zero, strict=True))
        q_seq = sum(b.bytes for b in zero)
        g += st.n_layers * float(roofline(mm_tok / peak, kv_tok / bw, st.eff.roofline_p))
        serial = decode_serial_kv_bytes(model, st.tp)
        mem_b = np.full_like(batches, kv_tok / bw)
        if serial > 0 and st.eff.decode_cta_bw > 0:  # one block per (sequence, head)
            nkv = heads_per_gpu(model, st.tp)[1]
            rounds = 1 + _extra_waves_array(st.gpu, batches, nkv)
            mem_b = np.maximum(mem_b, serial * rounds / st.eff.decode_cta_bw
                               / np.maximum(batches, 1.0))
        mm_b: FloatArray = np.full_like(batches, mm_tok / peak)
        g_by_batch += st.n_layers * roofline(mm_b, mem_b, st.eff.roofline_p)
        q += st.n_layers * (q_seq + st.eff.decode_key_floor * kv_tok) / bw
        coeffs.append((float(st.n_layers), mm_tok / peak, q_seq / bw, kv_tok / bw,
                       st.eff.roofline_p, st.eff.attention_key_floor))
    step_overhead = max(st.eff.step_overhead_s for st in stages)
    g_by_batch[0] = 0.0
    waves = _wave_table(model, stages, batches)
    adjust = sum(st.n_layers * (st.eff.nosplit_overhead_s() - st.eff.attention_overhead_s)
                 for st in stages
                 if st.eff.decode_cta_bw > 0 and decode_serial_kv_bytes(model, st.tp) > 0)
    return StepCostModel(dep, lin, head, g, q, step_overhead, stages, tuple(coeffs), g_by_batch,
                         waves, float(adjust))


@functools.lru_cache(maxsize=256)
def _cached(dep: Deployment, efficiency: Efficiency | None) -> StepCostModel:
    return build_cost_model(dep, efficiency)


def cost_model(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1, pp: int = 1,
               efficiency: Efficiency | None = None) -> StepCostModel:
    """The (cached) step cost model of `model` on `pp` stages of `tp` x `gpu`."""
    if tp < 1 or pp < 1:
        raise SpecError("tp and pp must be >= 1")
    return _cached(make_deployment(get_model(model), get_gpu(gpu), tp, pp), efficiency)


def cost_model_for(dep: Deployment, efficiency: Efficiency | None = None) -> StepCostModel:
    return _cached(dep, efficiency)


def prefill_time(model: ModelSpec | str, gpu: GPUSpec | str, tp: int, n_tokens: int,
                 batch: int = 1, *, pp: int = 1, efficiency: Efficiency | None = None) -> float:
    """Seconds for one prefill iteration of `batch` prompts of `n_tokens` tokens each."""
    if n_tokens < 1 or batch < 1:
        raise SpecError("prefill_time needs n_tokens >= 1 and batch >= 1")
    return cost_model(model, gpu, tp, pp, efficiency).prefill_time([n_tokens] * batch)


def decode_step_time(model: ModelSpec | str, gpu: GPUSpec | str, tp: int, batch_size: int,
                     mean_context: float, *, pp: int = 1,
                     efficiency: Efficiency | None = None) -> float:
    """Seconds for one decode iteration of `batch_size` sequences averaging `mean_context`
    cached tokens (the time between two output tokens of each sequence)."""
    if batch_size < 1 or mean_context < 0:
        raise SpecError("decode_step_time needs batch_size >= 1 and mean_context >= 0")
    cm = cost_model(model, gpu, tp, pp, efficiency)
    return cm.decode_step_time(batch_size, batch_size * mean_context)
