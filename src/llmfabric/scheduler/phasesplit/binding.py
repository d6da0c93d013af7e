"""Which live session holds which planner GPUs, read from the registry (the PD controller).

A plan names GPUs by the planner's ids (the cluster YAML's order); the fabric knows sessions.
The controller binds them once, when it starts:

1. explicit: a node started with `--label pd.gpus=0-3` holds planner GPUs 0..3 (ids and
   ranges, comma-separated), whatever its role, if its record shows those GPUs' type and at
   least as many GPUs;
2. otherwise by role and hardware: each plan replica (prefill ones first, in plan order)
   takes the first unbound live node, in session-id order, that serves the model in the
   replica's phase on the same GPU type (case-insensitive) with at least as many GPUs.

Labels and records are claims: any member can label itself `pd.gpus=0` and take a replica's
traffic (every prompt, for a prefill replica). `trusted(record)` restricts both ways of
binding (the CLI: on certificate networks, the controller's own verified provider). A label
that does not parse, names GPUs outside the plan or of another type, or claims GPUs another
label claims too is skipped (`BindingNotes`): it no longer stops the controller, and no
claimant of a contested GPU gets it by label.

A replica nobody matches stays unbound: its routing weight goes to no session and the
controller logs it. Records whose sessions are gone later are what `lost_gpus` detects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.errors import SchedulerError
from llmfabric.scheduler.observed import observed_workload
from llmfabric.scheduler.phasesplit.controller import PDBinding
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import PDWorkload

GPU_LABEL = "pd.gpus"
_MAX_GPU_IDS = 4096


def parse_gpu_ids(spec: str) -> tuple[int, ...]:
    """ "0-3,5" -> (0, 1, 2, 3, 5); SchedulerError on anything else."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise SchedulerError(f"{GPU_LABEL}: not a GPU id or range: {part!r}") from None
        if a < 0 or b < a or len(out) + b - a >= _MAX_GPU_IDS:
            raise SchedulerError(f"{GPU_LABEL}: bad range {part!r}")
        out += range(a, b + 1)
    if not out or len(set(out)) != len(out):
        raise SchedulerError(f"{GPU_LABEL}: {spec!r} names no GPU or one GPU twice")
    return tuple(out)


def _serves(rec: NodeRecord, model: str) -> str | None:
    """The role `rec` serves `model` in, or None."""
    for m in rec.meta.models:
        if model in (m.id, *m.aliases):
            return str(m.role)
    return None


def bind_sessions(plan: PDPlan, records: Iterable[NodeRecord], model: str,
                  trusted: Callable[[NodeRecord], bool] = lambda _r: True,
                  notes: list[str] | None = None) -> PDBinding:
    """Bind the plan's replicas to live sessions serving `model` (module docstring); labels
    skipped are explained in `notes`."""
    notes = notes if notes is not None else []
    live = sorted((r for r in records if r.state in (Lifecycle.JOIN, Lifecycle.SERVING)
                   and _serves(r, model) is not None and trusted(r)),
                  key=lambda r: r.session_id)
    labels = {r.session_id: label for r in live if (label := r.meta.label(GPU_LABEL))}
    claims: dict[str, tuple[int, ...]] = {}
    for r in live:
        if r.session_id in labels:
            why = _label_refusal(plan, r, labels[r.session_id])
            if why is None:
                claims[r.session_id] = parse_gpu_ids(labels[r.session_id])
            else:
                notes.append(f"session {r.session_id}: {GPU_LABEL}={labels[r.session_id]} "
                             f"skipped: {why}")
    owners: dict[int, list[str]] = {}
    for sid, ids in claims.items():
        for g in ids:
            owners.setdefault(g, []).append(sid)
    contested = {sid for sids in owners.values() if len(sids) > 1 for sid in sids}
    for sid in sorted(contested):
        notes.append(f"session {sid}: {GPU_LABEL}={labels[sid]} skipped: another "
                     "session's label claims the same GPUs")
    bound = {sid: ids for sid, ids in claims.items() if sid not in contested}
    used = {g for ids in bound.values() for g in ids}
    for phase in ("prefill", "decode"):
        for rep in plan.replicas(phase):
            if used & set(rep.gpus):
                continue
            gpu_type = plan.cluster.gpus[rep.gpus[0]].type.lower()
            match = next((r for r in live if r.session_id not in bound
                          and r.session_id not in labels and _serves(r, model) == phase
                          and r.meta.hardware.gpu_model.lower() == gpu_type
                          and r.meta.hardware.gpu_count >= len(rep.gpus)), None)
            if match is not None:
                bound[match.session_id] = rep.gpus
                used |= set(rep.gpus)
    return PDBinding(bound)


def _label_refusal(plan: PDPlan, rec: NodeRecord, label: str) -> str | None:
    try:
        ids = parse_gpu_ids(label)
    except SchedulerError as exc:
        return str(exc)
    n_gpus = len(plan.cluster.gpus)
    if max(ids) >= n_gpus:
        return f"outside the plan's {n_gpus} GPUs"
    types = {plan.cluster.gpus[g].type.lower() for g in ids}
    hw = rec.meta.hardware
    if types != {hw.gpu_model.lower()} or hw.gpu_count < len(ids):
        return (f"the plan's GPUs there are {', '.join(sorted(types))}; the node shows "
                f"{hw.gpu_count} x {hw.gpu_model or 'no GPU'}")
    return None


def observed_pd_workload(records: Iterable[NodeRecord], model: str, plan: PDPlan,
                         trusted: Callable[[NodeRecord], bool] = lambda _r: True
                         ) -> PDWorkload | None:
    """The model's workload as the ingress nodes observe it, with the plan's SLO; None
    before any ingress has seen requests with usage. Read as the fleet controller reads it
    (scheduler/observed.py): ingress records only, one per peer, each claim capped, and
    `trusted` on top (a plain member's 1e12 req/s once made every reschedule fail)."""
    workload, _ = observed_workload(records, default_in=0.0, default_out=0.0,
                                    trusted=trusted)
    load = next((m for m in workload.loads if m.model in (model, plan.model.name)), None)
    if load is None or load.arrival_rate <= 0 or load.mean_in < 1:
        return None
    return PDWorkload.from_means(load.arrival_rate, load.mean_in, load.mean_out,
                                 slo=plan.workload.slo)
