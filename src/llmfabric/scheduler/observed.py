"""The fabric's observed workload: the per-model demand every ingress publishes, summed.

Each ingress node keeps a sliding window of the requests it routed (ingress.demand) and puts a
per-model summary in its registry record (ModelDemand). Every node holds every record, so the
fleet controller reads the whole fabric's workload from its own replica, no central collector.
Rates add up over ingress nodes; token means are averaged weighted by rate. Names callers used
(aliases) are mapped to the served model id they answer to. A model whose ingresses saw no
usage yet gets the default lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.problem import ModelLoad, Workload

DEFAULT_MEAN_IN = 512.0
DEFAULT_MEAN_OUT = 128.0


def _canonical_names(records: list[NodeRecord]) -> dict[str, str]:
    names: dict[str, str] = {}
    for rec in records:
        for sm in rec.meta.models:
            for alias in sm.aliases:
                names.setdefault(alias, sm.id)
    for rec in records:  # an id always maps to itself, even if another model uses it as alias
        for sm in rec.meta.models:
            names[sm.id] = sm.id
    return names


def observed_workload(
    records: Iterable[NodeRecord],
    *,
    known: Callable[[str], bool] = lambda _model: True,
    default_in: float = DEFAULT_MEAN_IN,
    default_out: float = DEFAULT_MEAN_OUT,
) -> tuple[Workload, list[str]]:
    """(workload, notes): demand summed over live ingress records; models `known` rejects
    (the performance model cannot price them) are left out with a note."""
    recs = [r for r in records if r.state < Lifecycle.DOWN]
    canonical = _canonical_names(recs)
    rate: dict[str, float] = {}
    weighted_in: dict[str, float] = {}
    weighted_out: dict[str, float] = {}
    measured: dict[str, float] = {}  # rate of the entries that carried token means
    for rec in recs:
        for d in rec.meta.demand:
            model = canonical.get(d.model, d.model)
            rate[model] = rate.get(model, 0.0) + d.rate
            if d.mean_out > 0:
                measured[model] = measured.get(model, 0.0) + d.rate
                weighted_in[model] = weighted_in.get(model, 0.0) + d.rate * d.mean_in
                weighted_out[model] = weighted_out.get(model, 0.0) + d.rate * d.mean_out
    loads: list[ModelLoad] = []
    notes: list[str] = []
    for model in sorted(rate):
        if not known(model):
            notes.append(f"model {model!r}: demand {rate[model]:.3g} req/s observed, but the "
                         "performance model does not know it; left out of the plan")
            continue
        w = measured.get(model, 0.0)
        mean_in = weighted_in[model] / w if w > 0 else default_in
        mean_out = weighted_out[model] / w if w > 0 else default_out
        loads.append(ModelLoad(model, rate[model], mean_in, max(1.0, mean_out)))
    return Workload(tuple(loads)), notes
