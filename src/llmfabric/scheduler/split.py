"""The objective every policy is scored by: each model's load split optimally over its groups.

For fixed replica counts, `model_split` gives the best split of one model's load and its value
in seconds of the workload's mean E2E latency (load not served charged the penalty):
- with the table formulation: equal split inside each group, load shares in 1/Q steps
  (`placement.split_load`, exactly the table formulation's model);
- otherwise: groups priced by their convex envelopes, continuous shares
  (`levels.split_envelope`, the convex formulation's model without its integer rounding).
So greedy, memP, the local search and CP-SAT are all judged on the model CP-SAT solves, and
CP-SAT's bound is a bound on the same objective (up to the envelope cuts' integer rounding).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmfabric.scheduler.levels import split_envelope
from llmfabric.scheduler.placement import split_load
from llmfabric.scheduler.tables import LAT_SCALE, LVL_SCALE, Tables, formulation


def model_split(tables: Tables, chosen: Mapping[int, int], model: str
                ) -> tuple[float, dict[int, float], float]:
    """(value s, {candidate: share of the model's load}, unserved share)."""
    if formulation(tables) == "table":
        value, units, left = split_load(tables, chosen, model)
        q = tables.q
        return value / LAT_SCALE, {i: u / q for i, u in units.items()}, left / q
    value_f, taken, rest = split_envelope(tables, chosen, model)
    u = tables.u
    return value_f / LVL_SCALE, {i: w / u for i, w in taken.items()}, rest / u


def model_value(tables: Tables, chosen: Mapping[int, int], model: str) -> float:
    """`model_split`'s value alone (seconds of mean latency)."""
    return model_split(tables, chosen, model)[0]
