"""Reference-data rule R1: cross-check vidur's decode-regime token scaling against cuBLAS.

vidur profiles one decoder layer's linear operators per token count m (integer microseconds
per operator); aiconfigurator measured cuBLAS BF16 GEMMs of many shapes on the same GPUs
(A100-SXM4-80GB, H100-SXM). In the decode regime (m <= 64) a linear layer streams its weights
and its time barely depends on m; how much it may change from one token count to the next is
measured by aiconfigurator for every shape it has at both token counts.

Rule (the same for every vidur profile, decided before its effect was computed): for every
pair of consecutive vidur grid points (m, m'), m' <= 64, at which aiconfigurator measured
GEMMs on the same GPU, vidur's per-layer ratio LIN(m) / LIN(m') must lie within the central
90 % (5th to 95th percentile) of aiconfigurator's t(m) / t(m') over all its BF16 shapes
measured at both token counts. A point outside is FLAGGED and replaced by
LIN(m') x the median aiconfigurator ratio. Pairs are checked from large m to small, so a
replaced point is the reference of the next smaller one. GPUs without aiconfigurator GEMMs
(A40) are not checked. The flagged points are reported; the validation is reported with and
without the rule.
"""

from __future__ import annotations

import csv
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DECODE_MAX_TOKENS = 64
BAND = (5.0, 95.0)  # percentiles of aiconfigurator's step ratios that count as consistent
VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


@dataclass(frozen=True, slots=True)
class Flag:
    """One replaced vidur point: per-layer linear seconds at `m` tokens."""

    gpu: str
    model: str
    tp: int
    m: int
    m_next: int
    ratio: float  # vidur LIN(m) / LIN(m_next)
    band_lo: float
    band_hi: float
    median: float
    original_s: float
    replaced_s: float


def gemm_step_ratios(records: Iterable[dict[str, object]]
                     ) -> dict[tuple[int, int], tuple[float, float, float, int]]:
    """aiconfigurator BF16 GEMMs -> {(m, m'): (p5, median, p95, shapes)} of t(m)/t(m') over
    the shapes measured at both token counts (medians of repeated measurements)."""
    samples: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for r in records:
        if r["gemm_dtype"] == "bfloat16":
            samples[(int(r["m"]), int(r["n"]), int(r["k"]))].append(  # type: ignore[call-overload]
                float(r["latency"]))  # type: ignore[arg-type]
    med = {key: float(np.median(v)) for key, v in samples.items()}
    by_m: dict[int, dict[tuple[int, int], float]] = defaultdict(dict)
    for (m, n, k), t in med.items():
        by_m[m][(n, k)] = t
    out: dict[tuple[int, int], tuple[float, float, float, int]] = {}
    ms = sorted(m for m in by_m if m <= DECODE_MAX_TOKENS)
    for m in ms:
        for m2 in ms:
            if m2 <= m:
                continue
            shared = by_m[m].keys() & by_m[m2].keys()
            if not shared:
                continue
            ratios = np.array([by_m[m][s] / by_m[m2][s] for s in shared])
            lo, hi = np.percentile(ratios, BAND)
            out[(m, m2)] = (float(lo), float(np.median(ratios)), float(hi), len(shared))
    return out


def layer_table(path: Path) -> dict[int, dict[int, float]]:
    """vidur mlp.csv -> {tp: {m: per-layer linear seconds}} (first row of each (tp, m))."""
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        tp, m = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
        if m not in out[tp]:
            out[tp][m] = sum(float(r[f"time_stats.{o}.median"]) for o in VIDUR_OPS) / 1e3
    return out


def flags_for(gpu: str, model: str, tp: int, layer: dict[int, float],
              ratios: dict[tuple[int, int], tuple[float, float, float, int]]) -> list[Flag]:
    """Apply the rule to one profile; `layer` is updated in place with the replacements."""
    grid = sorted(layer)
    out = []
    for m, m2 in reversed(list(itertools.pairwise(grid))):
        if m2 > DECODE_MAX_TOKENS or (m, m2) not in ratios:
            continue
        lo, med, hi, _ = ratios[(m, m2)]
        q = layer[m] / layer[m2]
        if lo <= q <= hi:
            continue
        new = layer[m2] * med
        out.append(Flag(gpu, model, tp, m, m2, q, lo, hi, med, layer[m], new))
        layer[m] = new
    return out


def corrections(vidur_root: Path, vidur_gpus: dict[str, str], aic_root: Path,
                aic_dirs: dict[str, str], read: Callable[[Path], list[dict[str, object]]]
                ) -> list[Flag]:
    """Every flagged point of every vidur profile whose GPU has aiconfigurator GEMMs.
    vidur_gpus: vidur directory -> GPU name; aic_dirs: GPU name -> aiconfigurator directory."""
    out: list[Flag] = []
    for gdir, gpu in vidur_gpus.items():
        if gpu not in aic_dirs:
            continue
        ratios = gemm_step_ratios(read(aic_root / aic_dirs[gpu] / "gemm/gemm_perf.parquet"))
        for path in sorted((vidur_root / gdir).glob("*/*/mlp.csv")):
            with path.open() as fh:
                head = next(csv.DictReader(fh), None)
            if head is None or "time_stats.post_attention_layernorm.median" not in head:
                continue
            for tp, layer in sorted(layer_table(path).items()):
                out += flags_for(gpu, path.parent.name, tp, layer, ratios)
    return out


def replacement_map(flags: Iterable[Flag]) -> dict[tuple[str, str, int, int], float]:
    """(gpu, vidur model directory, tp, m) -> replaced per-layer linear seconds."""
    return {(f.gpu, f.model, f.tp, f.m): f.replaced_s for f in flags}
