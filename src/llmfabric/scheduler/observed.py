"""The fabric's observed workload: the per-model demand every ingress publishes, summed.

Each ingress node keeps a sliding window of the requests it routed (ingress.demand) and puts a
per-model summary in its registry record (ModelDemand). Every node holds every record, so the
fleet controller reads the whole fabric's workload from its own replica, no central collector.
Rates add up over ingress nodes; token means are averaged weighted by rate. Names callers used
(aliases) are mapped to the served model id they answer to, as routing resolves them: an id is
itself, an alias maps when every serving record that lists it lists it for the same id (an
alias of several models is counted for none, with a note). A model whose ingresses saw no
usage yet gets the default lengths.

Demand is a claim by whoever signed the record, so it is bounded (tests play a member that
publishes 10**11 req/s for its own model): only records that declare the ingress role count,
one per peer (its latest record: more sessions of one key add nothing), each model's rate at
most MAX_RATE_PER_INGRESS and token means at most MAX_MEAN_TOKENS; `trusted(record)` can
restrict it further (e.g. to ingress nodes of verified providers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.problem import ModelLoad, Workload

DEFAULT_MEAN_IN = 512.0
DEFAULT_MEAN_OUT = 128.0
MAX_RATE_PER_INGRESS = 10_000.0  # requests/s one ingress may claim for one model
MAX_MEAN_TOKENS = 1_000_000.0


def _one_ingress_record_per_peer(records: list[NodeRecord]) -> list[NodeRecord]:
    latest: dict[str, NodeRecord] = {}
    for rec in records:
        if "ingress" not in rec.meta.roles:
            continue
        cur = latest.get(rec.peer_id)
        if cur is None or (rec.updated_at, rec.session_id) > (cur.updated_at, cur.session_id):
            latest[rec.peer_id] = rec
    return [latest[p] for p in sorted(latest)]


def _canonical_names(records: list[NodeRecord]) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(name -> served model id, ambiguous alias -> the ids it is listed for).

    Resolved as routing resolves a name (routing/filters.py): an id always maps to itself
    (routing drops a candidate whose alias is another provider's model id); an alias maps to
    the id the SERVING records list it for, when they all agree. An alias listed for two ids
    is ambiguous (routing refuses it, 409: routing/filters.py `resolve`): its demand counts for
    neither, whichever record came first (the first record seen won, so a later record
    listing a popular alias could take its demand for its own model)."""
    ids = {sm.id for rec in records for sm in rec.meta.models}
    targets: dict[str, set[str]] = {}
    for rec in records:
        if rec.state is not Lifecycle.SERVING:
            continue
        for sm in rec.meta.models:
            for alias in sm.aliases:
                if alias not in ids:
                    targets.setdefault(alias, set()).add(sm.id)
    names = {alias: next(iter(t)) for alias, t in targets.items() if len(t) == 1}
    names.update((i, i) for i in ids)
    return names, {alias: t for alias, t in targets.items() if len(t) > 1}


def observed_workload(
    records: Iterable[NodeRecord],
    *,
    known: Callable[[str], bool] = lambda _model: True,
    default_in: float = DEFAULT_MEAN_IN,
    default_out: float = DEFAULT_MEAN_OUT,
    trusted: Callable[[NodeRecord], bool] = lambda _record: True,
) -> tuple[Workload, list[str]]:
    """(workload, notes): demand summed over live ingress records (bounded, one per peer);
    models `known` rejects (the performance model cannot price them) are left out with a
    note."""
    recs = [r for r in records if r.state < Lifecycle.DOWN]
    canonical, ambiguous = _canonical_names(recs)
    recs = [r for r in _one_ingress_record_per_peer(recs) if trusted(r)]
    rate: dict[str, float] = {}
    weighted_in: dict[str, float] = {}
    weighted_out: dict[str, float] = {}
    measured: dict[str, float] = {}  # rate of the entries that carried token means
    unmapped: dict[str, float] = {}  # ambiguous aliases: their demand
    for rec in recs:
        seen: set[str] = set()
        for d in rec.meta.demand:
            if d.model in ambiguous:
                unmapped[d.model] = unmapped.get(d.model, 0.0) + min(d.rate,
                                                                      MAX_RATE_PER_INGRESS)
                continue
            model = canonical.get(d.model, d.model)
            if model in seen:
                continue  # one entry per model and ingress (a record may repeat names)
            seen.add(model)
            r = min(d.rate, MAX_RATE_PER_INGRESS)
            mean_in, mean_out = min(d.mean_in, MAX_MEAN_TOKENS), min(d.mean_out, MAX_MEAN_TOKENS)
            rate[model] = rate.get(model, 0.0) + r
            if mean_out > 0:
                measured[model] = measured.get(model, 0.0) + r
                weighted_in[model] = weighted_in.get(model, 0.0) + r * mean_in
                weighted_out[model] = weighted_out.get(model, 0.0) + r * mean_out
    loads: list[ModelLoad] = []
    notes = [f"name {alias!r}: demand {unmapped[alias]:.3g} req/s observed, but it is an alias "
             f"of several models ({', '.join(sorted(ambiguous[alias]))}); counted for none"
             for alias in sorted(unmapped)]
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
