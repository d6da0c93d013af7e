"""TP all-reduce: the simulator's collective model against aiconfigurator's measurements.

Data (read at run time from the shared data directory, ai-dynamo/aiconfigurator, Apache-2.0):
- `<gpu>/comm/custom_allreduce_perf.parquet`, backend `vllm_graph`: vLLM's custom all-reduce
  under CUDA graphs (vLLM 0.14/0.24) as a decode step runs it; above 8 MiB vLLM hands the
  message to NCCL, so the large sizes of this file are NCCL calls too;
- `<gpu>/nccl/nccl_perf.parquet`, op `all_reduce`, dtype `half`: nccl-tests all_reduce_perf.
`message_size` is in ELEMENTS in both (the collectors log size // bytes_per_element and the
tensor's element count); BF16/FP16, so bytes = 2 x message_size.

Protocol: each (file, ranks, size) point is in the FIT or the HOLDOUT half by a stable hash.
`fit` fits one regime (base + per-rank latency + bus bandwidth, `sim.collectives`) by relative
least squares (linear in the three parameters): the custom regime on the fit half of the vLLM
file below 8 MiB, the NCCL regime on the fit half of the NCCL file. `evaluate` reports the
MAPE of a model (the old ring formula, the shipped fit) on each half of each file.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmfabric.sim import GPUSpec
from llmfabric.sim.collectives import (
    CUSTOM_MAX_BYTES,
    AllReduceModel,
    AllReduceRegime,
    ring_model,
)

FloatArray = npt.NDArray[np.float64]
BYTES_PER_ELEMENT = 2  # BF16 / FP16


@dataclass(frozen=True, slots=True)
class Points:
    """Measured all-reduces of one file on one GPU: ranks, bytes, seconds, fit-half mask."""

    name: str
    ranks: FloatArray
    n_bytes: FloatArray
    seconds: FloatArray
    fit: npt.NDArray[np.bool_]

    def select(self, mask: npt.NDArray[np.bool_]) -> Points:
        return Points(self.name, self.ranks[mask], self.n_bytes[mask], self.seconds[mask],
                      self.fit[mask])


def _points(name: str, rows: list[tuple[int, int, float]]) -> Points:
    ranks = np.array([r[0] for r in rows], dtype=np.float64)
    n_bytes = np.array([r[1] * BYTES_PER_ELEMENT for r in rows], dtype=np.float64)
    seconds = np.array([r[2] / 1e3 for r in rows])  # ms -> s
    fit = np.array([zlib.crc32(f"{name}|n{int(n)}|b{int(b)}".encode()) % 2 == 0
                    for n, b in zip(ranks, n_bytes, strict=True)], dtype=bool)
    return Points(name, ranks, n_bytes, seconds, fit)


def load(base: Path, read: Callable[[Path], list[dict[str, object]]]) -> dict[str, Points]:
    """The two measurement files of one aiconfigurator GPU directory."""
    custom = [(int(r["num_gpus"]), int(r["message_size"]), float(r["latency"]))  # type: ignore[call-overload, arg-type]
              for r in read(base / "comm/custom_allreduce_perf.parquet")
              if r["backend"] == "vllm_graph"]
    nccl = [(int(r["num_gpus"]), int(r["message_size"]), float(r["latency"]))  # type: ignore[call-overload, arg-type]
            for r in read(base / "nccl/nccl_perf.parquet")
            if r["op_name"] == "all_reduce" and r["nccl_dtype"] == "half"]
    return {"vllm": _points("vllm", custom), "nccl": _points("nccl", nccl)}


def fit_regime(p: Points) -> AllReduceRegime:
    """Relative least squares of t = base + per_rank (n-1) + 2(n-1)/n B / bus_bw."""
    share = 2.0 * (p.ranks - 1) / p.ranks
    design = np.stack([np.ones_like(p.ranks), p.ranks - 1, share * p.n_bytes], axis=1)
    w = 1.0 / p.seconds
    coef, *_ = np.linalg.lstsq(design * w[:, None], p.seconds * w, rcond=None)
    base, per_rank, inv_bw = (float(c) for c in coef)
    return AllReduceRegime(max(base, 0.0), max(per_rank, 0.0), 1.0 / max(inv_bw, 1e-18))


def fit(points: dict[str, Points]) -> AllReduceModel:
    vllm = points["vllm"]
    custom = vllm.select(vllm.fit & (vllm.n_bytes < CUSTOM_MAX_BYTES))
    nccl = points["nccl"].select(points["nccl"].fit)
    return AllReduceModel(nccl=fit_regime(nccl), custom=fit_regime(custom))


def _mape(model: AllReduceModel, p: Points, nccl_only: bool) -> float:
    if not p.seconds.size:
        return float("nan")
    pred = np.concatenate([
        model.nccl.time(np.array([b]), int(n)) if nccl_only else model.times(np.array([b]),
                                                                              int(n))
        for n, b in zip(p.ranks, p.n_bytes, strict=True)])
    return float(np.mean(np.abs(pred / p.seconds - 1)))


def evaluate(model: AllReduceModel, points: dict[str, Points]) -> dict[str, float]:
    """MAPE per file and half; the NCCL file is compared with the model's NCCL regime (what
    nccl-tests runs), the vLLM file with the model as vLLM dispatches it."""
    out: dict[str, float] = {}
    for name, p in points.items():
        nccl_only = name == "nccl"
        for half, mask in (("fit", p.fit), ("holdout", ~p.fit)):
            out[f"{name}_{half}"] = _mape(model, p.select(mask), nccl_only)
        small = p.select(~p.fit & (p.n_bytes < CUSTOM_MAX_BYTES))
        large = p.select(~p.fit & (p.n_bytes >= CUSTOM_MAX_BYTES))
        out[f"{name}_holdout_below_8MiB"] = _mape(model, small, nccl_only)
        out[f"{name}_holdout_from_8MiB"] = _mape(model, large, nccl_only)
    return out


def small_message_us(model: AllReduceModel, points: dict[str, Points],
                     n_bytes: float = 512.0) -> dict[str, float]:
    """One small all-reduce (default 512 B) at 2/4/8 ranks: measured (nearest size at or
    below, each file) and modelled, microseconds."""
    out: dict[str, float] = {}
    for n in (2, 4, 8):
        out[f"model_n{n}"] = model.time(n_bytes, n) * 1e6
        for name, p in points.items():
            sel = (p.ranks == n) & (p.n_bytes <= n_bytes)
            if sel.any():
                i = np.flatnonzero(sel)[np.argmax(p.n_bytes[sel])]
                out[f"{name}_n{n}"] = float(p.seconds[i]) * 1e6
    return out


def report(gpus: dict[str, GPUSpec], shipped: Callable[[GPUSpec], AllReduceModel],
           root: Path, read: Callable[[Path], list[dict[str, object]]], refit: bool
           ) -> dict[str, dict[str, object]]:
    """Per GPU: MAPE of the old ring formula, of the shipped model (and of a fresh fit with
    `refit`), per file and half; small-message latencies; the fitted parameters."""
    out: dict[str, dict[str, object]] = {}
    for gdir, gpu in gpus.items():
        points = load(root / gdir, read)
        ring = ring_model(gpu.intra_node_bw, gpu.intra_node_latency_s)
        entry: dict[str, object] = {
            "ring_formula": evaluate(ring, points),
            "shipped": evaluate(shipped(gpu), points),
            "small_message_us": small_message_us(shipped(gpu), points),
            "ring_small_message_us": small_message_us(ring, points),
        }
        if refit:
            fresh = fit(points)
            entry["fitted_now"] = {
                "evaluation": evaluate(fresh, points),
                "nccl": {"base_s": fresh.nccl.base_s, "per_rank_s": fresh.nccl.per_rank_s,
                         "bus_bw": fresh.nccl.bus_bw},
                "custom": None if fresh.custom is None else {
                    "base_s": fresh.custom.base_s, "per_rank_s": fresh.custom.per_rank_s,
                    "bus_bw": fresh.custom.bus_bw},
            }
        out[gpu.name] = entry
    return out
