"""Lightweight rescheduling (ThunderServe §3.4, App. G; COMPANIONS.md §1.4): keep every
surviving replica's configuration (no re-deduction, no reload), re-choose only the phases and
the routing.

Replicas that lost a GPU are dropped; a group keeps its other DP copies. Phase vectors over the
remaining groups are enumerated exhaustively for <= 12 groups (else a tabu search with only
flip moves, same budget), each scored by the routing LP under the (new) workload (load
beyond the options' headroom counted as missed); the best wins, ties going to fewer flips.
Output: the new plan plus SetRole for each flipped group and one SetRouting.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import numpy as np

from llmfabric.scheduler.decisions import SetRole, SetRouting
from llmfabric.scheduler.errors import InfeasibleError
from llmfabric.scheduler.phasesplit.config import GroupConfig
from llmfabric.scheduler.phasesplit.evaluate import Evaluated, replicas_of
from llmfabric.scheduler.phasesplit.groups import Group
from llmfabric.scheduler.phasesplit.orchestrate import PairModel
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.stability import HEADROOM
from llmfabric.scheduler.phasesplit.tabu import to_plan

EXHAUSTIVE_GROUPS = 12

RescheduleDecision = SetRole | SetRouting


def _survivors(plan: PDPlan, lost: set[int]) -> tuple[list[Group], list[GroupConfig]]:
    groups, configs = [], []
    for g, c in zip(plan.groups, plan.configs, strict=True):
        alive = tuple(r for r in c.replica_configs if not lost & set(r.gpus))
        if alive:
            groups.append(Group(frozenset(g.gpus - lost), g.phase))
            configs.append(GroupConfig(c.tp, c.pp, alive))
    return groups, configs


def _score(groups: list[Group], configs: list[GroupConfig], plan: PDPlan,
           workload: PDWorkload, orchestrate: bool,
           headroom: float = HEADROOM) -> Evaluated | None:
    pre, dec = replicas_of(groups, configs, "prefill"), replicas_of(groups, configs, "decode")
    if not pre or not dec:
        return None
    pm = PairModel(pre, dec, plan.cluster, plan.model, workload, plan.kv_bits, plan.kv_group,
                   headroom=headroom)
    return Evaluated(tuple(groups), tuple(configs), pm.route(orchestrate), pre, dec)


def _vectors(n: int, current: tuple[str, ...], options: TabuOptions
             ) -> Iterable[tuple[str, ...]]:
    if n <= EXHAUSTIVE_GROUPS:
        yield from itertools.product(("prefill", "decode"), repeat=n)
        return
    rng = np.random.default_rng(options.seed)
    x = current
    yield x
    for _ in range(options.n_step * options.n_neigh):
        k = int(rng.integers(n))
        x = (*x[:k], "decode" if x[k] == "prefill" else "prefill", *x[k + 1:])
        yield x


def lightweight(plan: PDPlan, lost_gpus: Iterable[int] = (), workload: PDWorkload | None = None,
                options: TabuOptions | None = None
                ) -> tuple[PDPlan, list[RescheduleDecision]]:
    """Re-plan phases and routing after losing GPUs and/or under a new workload."""
    opts = options or TabuOptions()
    lost = {int(g) for g in lost_gpus}
    unknown = lost - set(range(len(plan.cluster.gpus)))
    if unknown:
        raise InfeasibleError(f"unknown GPU ids {sorted(unknown)}")
    wl = workload or plan.workload
    groups, configs = _survivors(plan, lost)
    if len(groups) < 2:
        raise InfeasibleError("fewer than two groups survive: a full re-plan is needed")
    current = tuple(g.phase for g in groups)
    best: tuple[tuple[float, float, int], Evaluated] | None = None
    for vec in _vectors(len(groups), current, opts):
        trial = [Group(g.gpus, p) for g, p in zip(groups, vec, strict=True)]
        ev = _score(trial, configs, plan, wl, opts.orchestrate, opts.headroom)
        if ev is None:
            continue
        flips = sum(a != b for a, b in zip(vec, current, strict=True))
        key = (round(ev.routing.score, 9), -round(ev.routing.unserved, 9), -flips)
        if best is None or key > best[0]:
            best = (key, ev)
    if best is None:
        raise InfeasibleError("no phase assignment of the surviving groups serves requests")
    ev = best[1]
    same = dataclasses.replace(opts, kv_bits=plan.kv_bits, kv_group=plan.kv_group,
                               pipelined_pp=plan.pipelined_pp)
    new = to_plan(ev, plan.cluster, plan.model, wl, same,
                  notes=(f"lightweight reschedule of {plan.plan_id}: lost {sorted(lost)}",))
    decisions: list[RescheduleDecision] = []
    for old, g in zip(groups, ev.groups, strict=True):
        if old.phase != g.phase:
            decisions.append(SetRole((), g.phase, tuple(sorted(g.gpus))))
    decisions.append(SetRouting(new.plan_id, tuple(float(v) for v in new.routing.x),
                                tuple(tuple(float(v) for v in row) for row in new.routing.y)))
    return new, decisions
