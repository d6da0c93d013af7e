"""Efficiency factors that turn roofline peaks into achievable times, per GPU.

time(op) = R(FLOPs / (peak x compute), bytes / (bandwidth x memory)) + kernel_overhead_s,
where R is the roofline combiner: max(c, m) when `roofline_p` is 0, else the smooth
(c^p + m^p)^(1/p), which is slower near the ridge point as real kernels are. Attention runs
as ONE fused (FlashAttention-style) kernel per layer: matmul FLOPs at `attention` x peak, Q/K/V/O
bytes at `memory` x bandwidth, plus `attention_overhead_s`; softmax is overlapped in it. In
prefill each query row also pays for `attention_key_floor` extra keys (the per-query-tile
prologue/epilogue of FlashAttention kernels, which dominates short prompts); in decode every
sequence reads `decode_key_floor` extra tokens' worth of KV (per-sequence split/reduce work).
`step_overhead_s` is paid once per engine iteration (scheduler, sampling, launch gaps).
`decode_cta_bw` (bytes/s, 0 = off) models decode attention kernels that do NOT split the KV
sequence across thread blocks: FlashAttention-2's varlen/paged forward (vLLM's kernel on
Ampere/Ada) applies split-KV only in its GQA decode path ("seqlenq_ngroups_swapped", query heads
> KV heads), so multi-head-attention decode runs one thread block per (sequence, head), each
streaming its sequence's K/V alone at about `decode_cta_bw`; the kernel then takes at least
keys x (K+V bytes of one head) / decode_cta_bw however few blocks there are. FlashAttention-3
(Hopper) splits in every case (0 for H100).
`decode_wave_s`: a decode attention kernel runs (at least) one thread block per (sequence, KV
head); when batch x KV heads exceeds the GPU's SM count the blocks run in several waves and each
wave beyond the first adds about `decode_wave_s` of fixed latency (kernel data: ~3.5 us per
extra wave on A100, ~4 us on H100, for MHA and GQA shards alike). It depends on the batch only,
so decode stretches keep their closed form (it joins the per-step constant).
`l2_speedup`: reads whose working set is still resident in L2 from the previous repetition of a
MICROBENCHMARK run this many times faster than HBM (`costs.memory_bandwidth`); used only to
predict such measurements (the serving engine's reads are cold). Residency is partial and
smooth (`l2_hit_fraction`): the share of a working set W served from L2 is
1 / (1 + (W / C)^k) with C = `l2_usable_fraction` x L2 (the working set half of which still
hits: not all of L2 holds one kernel's data between repetitions) and k = `l2_sharpness`
(0: a hard threshold at C).
`decode_nosplit_overhead_s`: a split-KV decode kernel is followed by a combine kernel that merges
the partial softmax results; a non-split kernel (above) is a single kernel, so its fixed latency
is lower than `attention_overhead_s` (A100 kernel data: ~11 us vs ~18.7 us at 2+ sequences).

The per-GPU rows below were fitted by `benchmarks/sim_accuracy.py --fit` on HALF of the measured
rows (even row index of the measurement table) and are reported on ALL rows; see
docs/simulator.md ("Calibration"). GPUs without measurements use `DEFAULT_EFFICIENCY` (or the
row of their architecture sibling, listed in `_SIBLINGS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ShapedLowPrecision:
    """Shape-aware efficiency of GEMMs with <= 8-bit operands (FP8/FP4), for GEMMs whose
    (m, n, k) is known (the layers' projections): m is padded up to a multiple of `tile_m`
    (a CUTLASS tile computes `tile_m` rows whether or not they exist) and the GEMM reaches
    compute x share(m, n, k) of its low-precision peak, with
    share = `compute` x k / (k + k0) x m / (m + m0) x n / (n + n0): per-tile fixed work
    (prologue, epilogue, the output write) is amortized over a longer reduction and over more
    tiles. Fitted on aiconfigurator's H100 FP8 GEMMs (`benchmarks/_sim_fp8.py --fit-shaped`)."""

    compute: float
    k0: float
    m0: float
    n0: float
    tile_m: int

    def __post_init__(self) -> None:
        if not 0 < self.compute <= 1:
            raise SpecError("ShapedLowPrecision.compute must be in (0, 1]")
        if min(self.k0, self.m0, self.n0) < 0 or self.tile_m < 1:
            raise SpecError("ShapedLowPrecision needs k0, m0, n0 >= 0 and tile_m >= 1")

    def share(self, m: FloatArray, n: int, k: int) -> FloatArray:
        """compute x k/(k+k0) x m/(m+m0) x n/(n+n0) at the padded m (array in, array out;
        0 where m is 0)."""
        mp = self.padded(m)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(mp > 0, mp / (mp + self.m0), 0.0)
        return np.asarray(self.compute * k / (k + self.k0) * n / (n + self.n0) * frac,
                          dtype=np.float64)

    def padded(self, m: FloatArray) -> FloatArray:
        return np.asarray(np.ceil(np.asarray(m, dtype=np.float64) / self.tile_m) * self.tile_m,
                          dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Efficiency:
    compute: float = 0.70  # fraction of peak tensor FLOP/s reached by large GEMMs
    memory: float = 0.80  # fraction of peak HBM bandwidth reached by streaming kernels
    vector: float = 0.50  # fraction of fp32 peak for norms/rope/activations
    attention: float = 0.50  # fraction of tensor peak reached by fused attention matmuls
    kernel_overhead_s: float = 4e-6  # per kernel launch/tail
    attention_overhead_s: float = 1e-5  # per fused attention kernel
    attention_key_floor: float = 200.0  # prefill: extra keys of work per query row
    decode_key_floor: float = 0.0  # decode: extra cached tokens read per sequence (optional)
    step_overhead_s: float = 2e-4  # per engine iteration
    roofline_p: float = 0.0  # 0: max(compute, memory); p > 0: (c^p + m^p)^(1/p)
    decode_cta_bw: float = 0.0  # MHA decode without split-KV: bytes/s of one block; 0 = splits
    l2_speedup: float = 1.0  # warm-cache reads: memory time / this when the data is L2-resident
    l2_usable_fraction: float = 1.0  # C / L2: working set of which half is served from L2
    l2_sharpness: float = 0.0  # k of the residency curve 1/(1+(W/C)^k); 0 = hard threshold
    decode_wave_s: float = 0.0  # decode attention: seconds per thread-block wave beyond the first
    # fixed latency of a decode attention kernel that does NOT split the KV (no combine kernel);
    # None: the same as attention_overhead_s
    decode_nosplit_overhead_s: float | None = None
    # GEMMs with 8-bit (or narrower) operands reach this share of `compute` (of their own,
    # doubled peak): FP8 tensor-core GEMMs do not keep the BF16 efficiency (see CALIBRATED)
    low_precision_compute: float = 1.0
    # the same for GEMMs of known shape (the layers' projections), replacing the factor above
    # for them: None keeps the one factor
    low_precision_shaped: ShapedLowPrecision | None = None

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "vector", "attention"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise SpecError(f"efficiency {name} must be in (0, 1], got {value}")
        if min(self.kernel_overhead_s, self.attention_overhead_s, self.step_overhead_s) < 0:
            raise SpecError("overheads must be >= 0 seconds")
        if self.roofline_p < 0:
            raise SpecError("roofline_p must be >= 0 (0 means max)")
        if self.decode_cta_bw < 0:
            raise SpecError("decode_cta_bw must be >= 0 bytes/s (0: the kernel splits the KV)")
        if self.decode_nosplit_overhead_s is not None and self.decode_nosplit_overhead_s < 0:
            raise SpecError("decode_nosplit_overhead_s must be >= 0 seconds (or None)")
        if not 0 < self.low_precision_compute <= 1:
            raise SpecError("low_precision_compute must be in (0, 1]")
        if self.decode_wave_s < 0:
            raise SpecError("decode_wave_s must be >= 0 seconds")
        if self.l2_speedup < 1:
            raise SpecError("l2_speedup must be >= 1 (1: an L2-resident read is no faster)")
        if not 0 < self.l2_usable_fraction <= 1 or self.l2_sharpness < 0:
            raise SpecError("l2_usable_fraction must be in (0, 1] and l2_sharpness >= 0")
        if self.attention_key_floor < 0 or self.decode_key_floor < 0:
            raise SpecError("attention_key_floor and decode_key_floor must be >= 0 tokens")


    def nosplit_overhead_s(self) -> float:
        """Fixed latency of a non-split decode attention kernel (see decode_cta_bw)."""
        if self.decode_nosplit_overhead_s is None:
            return self.attention_overhead_s
        return self.decode_nosplit_overhead_s


T = TypeVar("T", float, npt.NDArray[np.float64])


def roofline(compute_s: T, memory_s: T, p: float) -> T:
    """Combine compute and memory time: max (p == 0) or the p-norm (p > 0)."""
    if p <= 0:
        return np.maximum(compute_s, memory_s)  # type: ignore[no-any-return]
    return (compute_s**p + memory_s**p) ** (1.0 / p)  # type: ignore[no-any-return]


def l2_hit_fraction(working_set: T, l2_bytes: float, eff: Efficiency) -> T:
    """Share of a repeated kernel's working set still in L2 from its previous repetition:
    1 / (1 + (W / C)^k), C = l2_usable_fraction x L2 (k = 0: 1 if W <= C else 0); 0 when the
    working set or the L2 size is unknown (<= 0)."""
    ws = np.asarray(working_set, dtype=np.float64)
    cap = eff.l2_usable_fraction * l2_bytes
    if cap <= 0:
        out = np.zeros_like(ws)
    elif eff.l2_sharpness <= 0:
        out = ((ws > 0) & (ws <= cap)).astype(np.float64)
    else:
        ratio = np.maximum(ws, 0.0) / cap
        out = np.where(ws > 0, 1.0 / (1.0 + ratio**eff.l2_sharpness), 0.0)
    if isinstance(working_set, np.ndarray):
        return out
    return float(out)


def warm_read_factor(working_set: T, l2_bytes: float, eff: Efficiency) -> T:
    """Memory time of a warm (repeated) read over that of a cold one: the resident share runs
    `l2_speedup` times faster, the rest at the HBM rate."""
    hit = l2_hit_fraction(working_set, l2_bytes, eff)
    return 1.0 - hit * (1.0 - 1.0 / eff.l2_speedup)


DEFAULT_EFFICIENCY = Efficiency()

# Fitted by `benchmarks/sim_accuracy.py --fit` (speedup weight 0.3) on the FIT half of the
# measured rows; `decode_cta_bw` was fitted alone afterwards (`--fit --fit-params decode_cta_bw`,
# other factors as shipped); `l2_speedup` and `decode_wave_s` were fitted together afterwards
# (`--fit --fit-params decode_wave_s,l2_speedup`) and kept where they improved the HOLDOUT half:
# on H100 only (A100's fitted 1.75 us per wave made its holdout decode rows worse, see
# docs/simulator.md). Last, `decode_nosplit_overhead_s` and `decode_cta_bw` were refitted together
# (`--fit --fit-params decode_nosplit_overhead_s,decode_cta_bw`; A100 only, as only it runs
# non-split kernels); see docs/simulator.md for the protocol and the resulting errors. With the
# L2 sizes in binary units (50 MiB on H100) the hard L2 threshold was replaced by the smooth
# residency curve: `l2_speedup`, `l2_usable_fraction` and `l2_sharpness` were fitted together
# (`--fit --fit-params l2_speedup,l2_usable_fraction,l2_sharpness`, the last two on their joint
# grid): H100 1.75, 0.91, 12 (the same with and without reference-data rule R1); the A100 and
# A40 stay at 1.0 (no L2 effect in their data).
# `low_precision_compute` (H100 0.61) was fitted alone afterwards on the fit half of
# aiconfigurator's H100 FP8 GEMMs (`benchmarks/_sim_fp8.py --fit`): FP8 GEMMs of served shapes
# reach ~1,100 TFLOP/s of the 1,979 peak where BF16 reaches ~800 of 989.
# `vector` is an effective factor for elementwise kernels (the profiled norms/activations are
# unfused PyTorch kernels), not a hardware utilisation. Keys are GPUSpec names.
# Shape-aware FP8 GEMMs (H100, and the GPUs that borrow its row): fitted on the same fit half
# of aiconfigurator's FP8 GEMMs by `benchmarks/_sim_fp8.py --fit-shaped` (grid over compute,
# k0, m0, n0 with 128-row tiles): FP8 GEMM MAPE 23.1 % -> 10.8 % on the other half; the one
# factor above stays for GEMMs of unknown shape (microbenchmarks' OpCosts, LM head).
H100_FP8_SHAPED = ShapedLowPrecision(compute=1.0, k0=512.0, m0=64.0, n0=2048.0, tile_m=128)

CALIBRATED: dict[str, Efficiency] = {
    "A100-80GB": Efficiency(compute=0.74, memory=0.76, vector=0.0355, attention=0.58,
                            kernel_overhead_s=4.5e-6, attention_overhead_s=1.75e-5,
                            attention_key_floor=208.0, roofline_p=3.0,
                            decode_cta_bw=2.187e10, decode_nosplit_overhead_s=8.5e-6),
    "H100-SXM": Efficiency(compute=0.74, memory=0.86, vector=0.0158, attention=0.66,
                           kernel_overhead_s=4.0e-6, attention_overhead_s=1.2e-5,
                           attention_key_floor=416.0, roofline_p=4.0,
                           l2_speedup=1.75, l2_usable_fraction=0.91, l2_sharpness=12.0,
                           decode_wave_s=2.25e-6, low_precision_compute=0.61,
                           low_precision_shaped=H100_FP8_SHAPED),
    # A40: linear operators fitted; no attention measurements, so its attention factors are
    # copied from the A100 row (same Ampere generation, same FlashAttention-2 decode kernel).
    "A40": Efficiency(compute=0.76, memory=0.76, vector=0.01, attention=0.58,
                      kernel_overhead_s=3.0e-6, attention_overhead_s=1.75e-5,
                      attention_key_floor=208.0, roofline_p=3.0, decode_cta_bw=2.187e10,
                      decode_nosplit_overhead_s=8.5e-6),
}

# GPUs without measurements borrow the row of a measured GPU of the same architecture.
_SIBLINGS: dict[str, str] = {
    "A100-40GB": "A100-80GB",
    "H100-PCIe": "H100-SXM",
    "H200": "H100-SXM",
    "GH200": "H100-SXM",
    # no Blackwell measurements: B200/GB200 use the H100's fitted factors (the e2e benchmark
    # holds the B200 out entirely, so its error there measures this borrowing)
    "B200": "H100-SXM",
    "GB200": "H100-SXM",
    "RTX-A6000": "A40",
    "RTX-A5000": "A40",
    "RTX-3090": "A40",
    "RTX-3090-Ti": "A40",
}


def efficiency_for(gpu: GPUSpec) -> Efficiency:
    """The fitted factors of `gpu`: its own row, its architecture sibling's, or (a GPU built on
    a built-in `base:` in YAML) those of the built-in it was derived from; else the defaults."""
    for name in (gpu.name, gpu.calibration_of):
        if name in CALIBRATED:
            return CALIBRATED[name]
        sibling = _SIBLINGS.get(name)
        if sibling is not None and sibling in CALIBRATED:
            return CALIBRATED[sibling]
    return DEFAULT_EFFICIENCY
