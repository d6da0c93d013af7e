"""Knobs shared by every placement policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmfabric.scheduler.errors import SpecError

Objective = Literal["latency", "throughput", "cost"]
Formulation = Literal["auto", "convex", "levels", "table"]
OBJECTIVES: tuple[Objective, ...] = ("latency", "throughput", "cost")


@dataclass(frozen=True, slots=True)
class PlacementOptions:
    """`load_units`: each model's load is split among its replica groups in 1/load_units steps.

    `curve_samples`: how many arrival rates per (model, GPU type, TP) the performance model is
    asked about (the rest is interpolated in log-rate); None asks about every rate exactly.
    `formulation`: "auto" (default) picks "table" while the tables are small (under
    `table_max_tuples` entries in all) and "levels" above; "levels" gives each replica a
    load level and keeps the model linear; "table" uses one table constraint per candidate
    over (replicas, load share), exact for equal splits but slow to presolve past a few
    dozen GPUs. `level_units`: a model's arrival rate in level units (per-replica load
    levels are log-spaced integers up to it).
    `workers`: CP-SAT workers; with fewer than 8 its LP-bounding workers do not run, so the
    gap closes slowly (8 is fine on 2 cores: workers interleave).
    `unserved_latency_s`: the latency charged to load that no replica takes (and the cap on
    any estimate), so an overloaded cluster still has a finite, comparable objective.
    `max_utilization`: the share of a replica's service rate (its completion rate when
    overloaded) the planner lets it take; load above that counts as unserved
    (`curves.RateCurve`). Below 1 so that planned queues stay bounded.
    """

    objective: Objective = "latency"
    load_units: int = 20
    time_limit_s: float = 10.0
    workers: int = 8
    curve_samples: int | None = 24
    unserved_latency_s: float = 1000.0
    max_utilization: float = 0.9
    one_tp_per_pool: bool = True
    # Stop when within this relative gap of the bound (0 = prove optimality). The level grid's
    # own discretization error is larger than the default.
    gap_limit: float = 0.02
    formulation: Formulation = "auto"
    table_max_tuples: int = 2_500
    level_units: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not 1 <= self.load_units <= 200:
            raise SpecError(f"load_units must be in 1..200, got {self.load_units}")
        if self.time_limit_s <= 0 or self.workers < 1:
            raise SpecError("time_limit_s must be > 0 and workers >= 1")
        if self.curve_samples is not None and self.curve_samples < 2:
            raise SpecError("curve_samples must be >= 2 (or None for exact estimates)")
        if self.formulation not in ("auto", "convex", "levels", "table"):
            raise SpecError("formulation must be auto, convex, levels or table, got "
                            f"{self.formulation!r}")
        if not 2 <= self.level_units <= 100_000:
            raise SpecError(f"level_units must be in 2..100000, got {self.level_units}")
        if self.unserved_latency_s <= 0:
            raise SpecError("unserved_latency_s must be > 0")
        if not 0 < self.max_utilization <= 1:
            raise SpecError(f"max_utilization must be in (0, 1], got {self.max_utilization}")
