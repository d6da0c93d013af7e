"""Tensor-parallel all-reduce cost, fitted on measured collectives per GPU class.

One all-reduce of `B` bytes (per rank) over `n` ranks in one alpha-beta regime costs

    t = base_s + per_rank_s * (n - 1) + 2(n - 1)/n * B / bus_bw

`base_s` is the fixed cost of one collective kernel (launch, flag/barrier exchange),
`per_rank_s` the latency each additional rank adds (ring hops, or the peers a one-shot kernel
waits for), `bus_bw` the bus bandwidth in NCCL's convention (bytes/s; 2(n-1)/n is the share of
the data each rank sends and receives in a bandwidth-optimal all-reduce). With
`base_s = 0` and `per_rank_s = 2 * link latency` this is the ring formula of HeroServe eq. 11
(`parallel.allreduce_time`), which is what GPUs without measurements use.

Network plans (HeroServe, `scheduler/netplan`) price a TP group's all-reduce over its routes:
`ina_model` (in-network aggregation at a switch, eqs. 8-10) and `ring_over_path` (eq. 11);
both are `AllReduceModel`s, so they plug into `Deployment.stage_allreduces` unchanged.

vLLM runs its own one-/two-shot "custom all-reduce" over NVLink for messages below
`custom_max_bytes` (8 MiB, vLLM's default) on 2, 4, 6 or 8 GPUs, and NCCL otherwise; the two
behave differently (A100: ~5 us vs ~10-23 us for a small message at 2-8 GPUs), so a fitted GPU
has one regime for each. The rows of `FITTED` were fitted by `benchmarks/sim_accuracy.py --fit`
(relative least squares on the FIT half of aiconfigurator's measurements: the custom regime on
vLLM's custom all-reduce under CUDA graphs below 8 MiB, the NCCL regime on nccl-tests
all_reduce_perf, both BF16/FP16) and are reported on the HOLDOUT half (docs/simulator.md,
"TP all-reduce").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import SpecError
from llmfabric.sim.hardware import GPUSpec, builtin_gpu

FloatArray = npt.NDArray[np.float64]

CUSTOM_MAX_BYTES = 8 * 1024 * 1024  # vLLM custom all-reduce: messages below 8 MiB
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)  # world sizes vLLM's custom all-reduce supports


@dataclass(frozen=True, slots=True)
class AllReduceRegime:
    """One alpha-beta regime: t = base_s + per_rank_s * (n - 1) + 2(n-1)/n * B / bus_bw."""

    base_s: float
    per_rank_s: float
    bus_bw: float  # bytes/s

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_rank_s < 0 or self.bus_bw <= 0:
            raise SpecError("an all-reduce regime needs base_s, per_rank_s >= 0 and bus_bw > 0")

    def time(self, n_bytes: FloatArray | float, n_ranks: int) -> FloatArray | float:
        if n_ranks <= 1:
            return np.zeros_like(n_bytes) if isinstance(n_bytes, np.ndarray) else 0.0
        share = 2.0 * (n_ranks - 1) / n_ranks
        return self.base_s + self.per_rank_s * (n_ranks - 1) + share * n_bytes / self.bus_bw


@dataclass(frozen=True, slots=True)
class AllReduceModel:
    """All-reduce cost on one GPU class: NCCL, plus vLLM's custom all-reduce (None: NCCL only)
    for messages below `custom_max_bytes` on `CUSTOM_WORLD_SIZES` ranks."""

    nccl: AllReduceRegime
    custom: AllReduceRegime | None = None
    custom_max_bytes: float = CUSTOM_MAX_BYTES

    def time(self, n_bytes: float, n_ranks: int) -> float:
        return float(self.times(np.array([float(n_bytes)]), n_ranks)[0])

    def times(self, n_bytes: FloatArray, n_ranks: int) -> FloatArray:
        """Seconds per all-reduce for each message size in `n_bytes` (vectorised)."""
        if n_ranks <= 1:
            return np.zeros_like(n_bytes)
        out = np.asarray(self.nccl.time(n_bytes, n_ranks), dtype=np.float64)
        if self.custom is not None and n_ranks in CUSTOM_WORLD_SIZES:
            small = np.asarray(self.custom.time(n_bytes, n_ranks), dtype=np.float64)
            out = np.where(n_bytes < self.custom_max_bytes, small, out)
        return out


def ring_model(bandwidth: float, latency_s: float) -> AllReduceModel:
    """HeroServe eq. 11 over a link: 2(n-1) latency + 2(n-1)/n bytes / bandwidth."""
    return AllReduceModel(AllReduceRegime(0.0, 2.0 * latency_s, bandwidth))


# Fitted on aiconfigurator's A100-SXM4-80GB and H100-80GB-HBM3 (SXM) measurements, FIT half
# (see the module docstring). Keys are GPUSpec names.
FITTED: dict[str, AllReduceModel] = {
    "A100-80GB": AllReduceModel(nccl=AllReduceRegime(9.56e-6, 1.97e-6, 181e9),
                                custom=AllReduceRegime(4.52e-6, 0.358e-6, 169e9)),
    "H100-SXM": AllReduceModel(nccl=AllReduceRegime(5.36e-6, 1.68e-6, 316e9),
                               custom=AllReduceRegime(4.10e-6, 0.188e-6, 245e9)),
}

# GPUs without measurements borrow a measured row: same NVLink generation (A100-40GB, H200,
# GH200: the row applies as is) or a newer one (Blackwell: NVLink 5, twice NVLink 4's
# per-GPU bandwidth), whose bus bandwidths are scaled by the ratio of the GPUs' link
# bandwidths (`scaled_regime`); the latency terms (kernel launch, barrier) are kept.
_SIBLINGS: dict[str, str] = {"A100-40GB": "A100-80GB", "H200": "H100-SXM", "GH200": "H100-SXM",
             "B200": "H100-SXM", "GB200": "H100-SXM"}


def scaled_regime(regime: AllReduceRegime, link_ratio: float) -> AllReduceRegime:
    """`regime` on a link `link_ratio` times as fast: bandwidth-bound part scaled, latency
    kept (a bandwidth-optimal all-reduce moves the same bytes over a faster link)."""
    if not link_ratio > 0:
        raise SpecError("link_ratio must be > 0")
    return AllReduceRegime(regime.base_s, regime.per_rank_s, regime.bus_bw * link_ratio)


def _fitted_row(name: str) -> AllReduceModel | None:
    own = FITTED.get(name)
    if own is not None or name not in _SIBLINGS:
        return own
    row = FITTED.get(_SIBLINGS[name])
    mine, theirs = builtin_gpu(name), builtin_gpu(_SIBLINGS[name])
    if row is None or mine is None or theirs is None:
        return row
    ratio = mine.intra_node_bw / theirs.intra_node_bw
    if ratio == 1.0:
        return row
    return AllReduceModel(scaled_regime(row.nccl, ratio),
                          None if row.custom is None else scaled_regime(row.custom, ratio),
                          row.custom_max_bytes)


def fitted_allreduce(gpu: GPUSpec) -> AllReduceModel | None:
    """The measured all-reduce model of `gpu` (or of its NVLink sibling); a GPU derived from a
    built-in (YAML `base:`) uses the built-in's model only while it keeps the built-in's link
    (interconnect and bandwidth): a different link is priced by the ring formula. Else None."""
    own = _fitted_row(gpu.name)
    if own is not None or not gpu.calibration_of:
        return own
    base = builtin_gpu(gpu.calibration_of)
    if base is None or (base.interconnect, base.intra_node_bw) != (gpu.interconnect,
                                                                   gpu.intra_node_bw):
        return None
    return _fitted_row(base.name)


def allreduce_model(gpu: GPUSpec) -> AllReduceModel:
    """All-reduce over `gpu`'s own intra-node link: fitted where measured, else the ring
    formula over the GPU's link bandwidth and latency."""
    return fitted_allreduce(gpu) or ring_model(gpu.intra_node_bw, gpu.intra_node_latency_s)


class PathCost(Protocol):
    """What a collective needs from one member's route (`topology.Route` satisfies it)."""

    @property
    def latency_s(self) -> float: ...

    @property
    def inverse_bw_sum(self) -> float: ...


def ina_model(paths_up: Sequence[PathCost], paths_down: Sequence[PathCost],
              t_agg: float = 1e-6) -> AllReduceModel:
    """In-network aggregation (HeroServe eqs. 8-10) as an affine all-reduce model for a group
    of len(paths_up) ranks: every rank sends its whole message up its path to the switch
    (store and forward: sum over hops of bytes / B_e), the switch aggregates (`t_agg`) and
    multicasts the sum down. t = t_agg + max latency up + max latency down + bytes x (max
    s/byte up + max s/byte down), folded into an `AllReduceRegime` whose bus_bw makes the
    NCCL-convention share 2(n-1)/n cancel: valid for exactly n = len(paths_up) ranks (the
    maxima are taken separately, so it is exact when one rank is slowest on both terms and
    an upper bound otherwise)."""
    if not paths_up or len(paths_up) != len(paths_down):
        raise SpecError("ina_model needs one up and one down path per rank (>= 1 rank)")
    if t_agg < 0:
        raise SpecError("t_agg must be >= 0")
    n = len(paths_up)
    base = t_agg + max(p.latency_s for p in paths_up) + max(p.latency_s for p in paths_down)
    slope = max(p.inverse_bw_sum for p in paths_up) + max(p.inverse_bw_sum for p in paths_down)
    if n == 1:
        return AllReduceModel(AllReduceRegime(base, 0.0, 1e30))
    if slope <= 0:
        raise SpecError("ina_model paths need a positive per-byte time")
    return AllReduceModel(AllReduceRegime(base, 0.0, 2.0 * (n - 1) / (n * slope)))


def ring_over_path(path_bw: float, hop_latency: float) -> AllReduceModel:
    """Ring all-reduce whose every step crosses a path of bottleneck `path_bw` (bytes/s) and
    latency `hop_latency` (s): HeroServe eq. 11 with a per-step latency (0 = the paper's
    form)."""
    if not path_bw > 0 or hop_latency < 0:
        raise SpecError("ring_over_path needs path_bw > 0 and hop_latency >= 0")
    return ring_model(path_bw, hop_latency)
