"""A calibrated residual layer on top of the analytic end-to-end predictions (optional).

The analytic replay (`e2e.replay`) predicts each measured row from specs, operator-level
efficiencies and the engine profiles. This layer multiplies its TTFT and TPOT by
`exp(w . x)`, x = (1, ln concurrency, ln ISL, ln OSL, ln TP), one weight vector per backend
and metric, fitted by ridge least squares on ln(measured / predicted) of the rows it is given
(the intercept is not penalized). It is an empirical correction of the analytic model's
systematic bias in the load and shape, NOT a model of anything: it knows no GPU or model, so
for two rows that differ only in the GPU it scales both predictions by the same factor (GPU
orderings are those of the analytic model). A backend with fewer than `min_rows` rows gets
the fit pooled over all backends; with no rows at all the correction is the identity.

    corr = fit_correction(fit_records)              # records: e2e.replay(...)["rows"]
    corrected = corr.apply(records)                  # new dicts, pred_* replaced
    e2e.replay(rows, correction=corr)                # the same, inside the replay

docs/simulator.md "Third pass" says what it buys: on the fit rows it lowers the error of
set-ups it has seen, and it does not transfer to set-ups it has not (leave-one-set-up-out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmfabric.sim.errors import SpecError

FEATURES = ("intercept", "ln_concurrency", "ln_isl", "ln_osl", "ln_tp")
METRICS = ("ttft", "tpot")
POOLED = "*"

Weights = tuple[float, ...]


def features(concurrency: int, isl: int, osl: int, tp: int) -> np.ndarray:
    """The regressors of one row: (1, ln c, ln ISL, ln OSL, ln TP)."""
    for name, v in (("concurrency", concurrency), ("isl", isl), ("osl", osl), ("tp", tp)):
        if not v >= 1:
            raise SpecError(f"{name} must be >= 1, got {v!r}")
    return np.array([1.0, math.log(concurrency), math.log(isl), math.log(osl), math.log(tp)])


def _row_features(rec: Mapping[str, Any]) -> np.ndarray:
    return features(int(rec["concurrency"]), int(rec["isl"]), int(rec["osl"]), int(rec["tp"]))


def _usable(rec: Mapping[str, Any]) -> bool:
    vals = [rec.get(k) for k in ("ttft_ms", "tpot_ms", "pred_ttft_ms", "pred_tpot_ms")]
    return "error" not in rec and all(
        isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in vals
    )


def ridge_fit(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """argmin_w |x w - y|^2 + ridge * |w[1:]|^2 (column 0, the intercept, unpenalized)."""
    if ridge < 0:
        raise SpecError(f"ridge must be >= 0, got {ridge}")
    penalty = np.eye(x.shape[1]) * ridge
    penalty[0, 0] = 0.0
    w, *_ = np.linalg.lstsq(x.T @ x + penalty, x.T @ y, rcond=None)
    return np.asarray(w, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ResidualCorrection:
    """Per-backend weights: `weights[backend][metric]`; backend `POOLED` ("*") is the
    fallback for backends not fitted. Empty: the identity."""

    weights: Mapping[str, Mapping[str, Weights]] = field(default_factory=dict)
    ridge: float = 0.0
    n_rows: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for backend, ws in self.weights.items():
            for m in METRICS:
                w = ws.get(m)
                if w is None or len(w) != len(FEATURES) or not all(map(math.isfinite, w)):
                    raise SpecError(
                        f"weights[{backend!r}][{m!r}] must be {len(FEATURES)} finite numbers "
                        f"({', '.join(FEATURES)}), got {w!r}"
                    )

    def factors(
        self, backend: str, concurrency: int, isl: int, osl: int, tp: int
    ) -> tuple[float, float]:
        """(TTFT factor, TPOT factor) for one row; (1, 1) where nothing was fitted."""
        w = self.weights.get(backend) or self.weights.get(POOLED)
        if not w:
            return 1.0, 1.0
        x = features(concurrency, isl, osl, tp)
        ttft, tpot = (math.exp(float(np.dot(w[m], x))) for m in METRICS)
        return ttft, tpot

    def apply(self, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Copies of `records` (replay rows) with `pred_ttft_ms`/`pred_tpot_ms` corrected and
        the analytic values kept as `analytic_ttft_ms`/`analytic_tpot_ms`; rows without a
        prediction are copied unchanged."""
        out = []
        for rec in records:
            new = dict(rec)
            pt, pp = rec.get("pred_ttft_ms"), rec.get("pred_tpot_ms")
            if (
                "error" not in rec
                and isinstance(pt, (int, float))
                and isinstance(pp, (int, float))
                and math.isfinite(pt)
                and math.isfinite(pp)
            ):
                ft, fp = self.factors(
                    str(rec["backend"]),
                    int(rec["concurrency"]),
                    int(rec["isl"]),
                    int(rec["osl"]),
                    int(rec["tp"]),
                )
                new["analytic_ttft_ms"], new["analytic_tpot_ms"] = pt, pp
                new["pred_ttft_ms"], new["pred_tpot_ms"] = pt * ft, pp * fp
            out.append(new)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES),
            "ridge": self.ridge,
            "n_rows": dict(self.n_rows),
            "weights": {b: {m: list(w) for m, w in ws.items()} for b, ws in self.weights.items()},
        }


def _fit_block(recs: Sequence[Mapping[str, Any]], ridge: float) -> dict[str, Weights]:
    x = np.stack([_row_features(r) for r in recs])
    out: dict[str, Weights] = {}
    for m in METRICS:
        y = np.array([math.log(r[f"{m}_ms"] / r[f"pred_{m}_ms"]) for r in recs])
        out[m] = tuple(float(v) for v in ridge_fit(x, y, ridge))
    return out


def fit_correction(
    records: Sequence[Mapping[str, Any]], *, ridge: float = 1.0, min_rows: int = 20
) -> ResidualCorrection:
    """Fit on replay rows that have a measurement and a prediction (others are skipped):
    one weight vector per backend with >= `min_rows` rows, plus a pooled one over all rows
    (the fallback for other backends)."""
    if min_rows < len(FEATURES):
        raise SpecError(f"min_rows must be >= {len(FEATURES)} (one per feature)")
    ok = [r for r in records if _usable(r)]
    weights: dict[str, dict[str, Weights]] = {}
    counts: dict[str, int] = {}
    if len(ok) >= min_rows:
        weights[POOLED] = _fit_block(ok, ridge)
        counts[POOLED] = len(ok)
    for backend in sorted({str(r["backend"]) for r in ok}):
        mine = [r for r in ok if r["backend"] == backend]
        if len(mine) >= min_rows:
            weights[backend] = _fit_block(mine, ridge)
            counts[backend] = len(mine)
    return ResidualCorrection(weights, ridge, counts)


def mape(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"n", "ttft_mape", "tpot_mape"} (percent) over the usable records."""
    ok = [r for r in records if _usable(r)]
    out: dict[str, Any] = {"n": len(ok)}
    for m in METRICS:
        out[f"{m}_mape"] = (
            100.0 * sum(abs(r[f"pred_{m}_ms"] / r[f"{m}_ms"] - 1.0) for r in ok) / len(ok)
            if ok
            else math.nan
        )
    return out


def leave_one_group_out(
    records: Sequence[Mapping[str, Any]], key: str, *, ridge: float = 1.0, min_rows: int = 20
) -> dict[str, dict[str, Any]]:
    """For each value g of `records[i][key]` (e.g. "gpu", "model"): the analytic MAPE of the
    rows with key == g, and their MAPE after a correction fitted on all OTHER rows."""
    out: dict[str, dict[str, Any]] = {}
    for g in sorted({str(r[key]) for r in records}):
        test = [r for r in records if str(r[key]) == g]
        corr = fit_correction(
            [r for r in records if str(r[key]) != g], ridge=ridge, min_rows=min_rows
        )
        out[g] = {
            "analytic": mape(test),
            "calibrated": mape(corr.apply(test)),
            "fitted_on": sum(1 for r in records if str(r[key]) != g and _usable(r)),
        }
    return out
