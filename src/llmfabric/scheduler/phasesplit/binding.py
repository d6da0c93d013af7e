"""Which live session holds which planner GPUs, read from the registry (the PD controller).

A plan names GPUs by the planner's ids (the cluster YAML's order); the fabric knows sessions.
The controller binds them once, when it starts:

1. explicit: a node started with `--label pd.gpus=0-3` holds planner GPUs 0..3 (ids and
   ranges, comma-separated), whatever its role;
2. otherwise by role and hardware: each plan replica (prefill ones first, in plan order)
   takes the first unbound live node, in session-id order, that serves the model in the
   replica's phase on the same GPU type (case-insensitive) with at least as many GPUs.

A replica nobody matches stays unbound: its routing weight goes to no session and the
controller logs it. Records whose sessions are gone later are what `lost_gpus` detects.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmfabric.registry.records import Lifecycle, ModelDemand, NodeRecord
from llmfabric.scheduler.errors import SchedulerError
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


def bind_sessions(plan: PDPlan, records: Iterable[NodeRecord], model: str) -> PDBinding:
    """Bind the plan's replicas to live sessions serving `model` (module docstring)."""
    live = sorted((r for r in records if r.state in (Lifecycle.JOIN, Lifecycle.SERVING)
                   and _serves(r, model) is not None), key=lambda r: r.session_id)
    bound: dict[str, tuple[int, ...]] = {}
    used: set[int] = set()
    n_gpus = len(plan.cluster.gpus)
    for r in live:
        label = r.meta.label(GPU_LABEL)
        if label:
            ids = parse_gpu_ids(label)
            if max(ids) >= n_gpus or used & set(ids):
                raise SchedulerError(f"session {r.session_id}: {GPU_LABEL}={label} is outside "
                                     f"the plan's {n_gpus} GPUs or overlaps another node")
            bound[r.session_id] = ids
            used |= set(ids)
    for phase in ("prefill", "decode"):
        for rep in plan.replicas(phase):
            if used & set(rep.gpus):
                continue
            gpu_type = plan.cluster.gpus[rep.gpus[0]].type.lower()
            match = next((r for r in live if r.session_id not in bound
                          and _serves(r, model) == phase
                          and r.meta.hardware.gpu_model.lower() == gpu_type
                          and r.meta.hardware.gpu_count >= len(rep.gpus)), None)
            if match is not None:
                bound[match.session_id] = rep.gpus
                used |= set(rep.gpus)
    return PDBinding(bound)


def observed_pd_workload(records: Iterable[NodeRecord], model: str, plan: PDPlan
                         ) -> PDWorkload | None:
    """The model's workload as the ingress nodes observe it (their published demand, summed
    over ingresses, lengths weighted by rate), with the plan's SLO; None before any ingress
    has seen requests with usage."""
    seen: list[ModelDemand] = [d for r in records if r.state is not Lifecycle.LEFT
                               for d in r.meta.demand if d.model in (model, plan.model.name)]
    rate = sum(d.rate for d in seen)
    if rate <= 0 or any(d.mean_in < 1 or d.mean_out < 1 for d in seen if d.rate > 0):
        return None
    mean_in = sum(d.rate * d.mean_in for d in seen) / rate
    mean_out = sum(d.rate * d.mean_out for d in seen) / rate
    return PDWorkload.from_means(rate, mean_in, mean_out, slo=plan.workload.slo)
