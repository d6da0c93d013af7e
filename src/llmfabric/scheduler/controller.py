"""The fleet controller: registry inventory + workload statistics -> placement -> decisions.

`decide()` is pure: given the registry records, the observed workload, the previous state and
the time, it says whether to re-plan (idle nodes appeared, or the workload drifted beyond a
threshold) and returns the decisions and the next state. Running nodes are kept (their
replicas enter the plan as fixed capacity) unless `reclaim` is set; then too, a node moved
in the last `reclaim_hold_s` stays fixed (per peer, so it holds across the node's new
session after a release). `FleetController` runs it
in a loop on an injected clock and hands decisions to an Executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from llmfabric.clock import Clock
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.decisions import Assign, Decision, Executor, Release
from llmfabric.scheduler.errors import SchedulerError
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.packing import pack
from llmfabric.scheduler.perf import PerformanceModel
from llmfabric.scheduler.placement import Group, Placement
from llmfabric.scheduler.policies import get_policy
from llmfabric.scheduler.problem import TP_DEGREES, Cluster, FixedGroup, Pool, Problem, Workload
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.scheduler.controller")

# GPUs a node may claim and still be planned for: the count is the record's claim (up to
# 2**20), a node takes GPU indexes below 64 only (node/serve/peer_api.py), and a claim of
# 2**16 kept one plan busy for minutes (2**20: gigabytes), so no round finished.
MAX_NODE_GPUS = 64


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    policy: str = "cpsat"
    template: str = "sim"
    drift_threshold: float = 0.25  # relative change of a model's arrival rate that re-plans
    min_rate: float = 0.1  # rates below this count as this much when measuring drift
    reclaim: bool = False  # re-plan running nodes too (the paper's default: no)
    # With reclaim: releases a round may send (the rest of the plan follows in later rounds,
    # each re-planned), and how long a bare node must stay bare before it is capacity (a node
    # flapping between bare and busy never makes the controller move running nodes).
    max_releases: int = 1
    reclaim_idle_s: float = 60.0
    # With reclaim: a node the controller moved (released, or assigned a model) is not
    # released again for this long (controller clock): demand that swings every round moves
    # each node at most once per hold; it stays fixed capacity of its model meanwhile.
    reclaim_hold_s: float = 600.0
    exclusive_nodes: bool = True  # one engine (one model) per node
    pending_timeout_s: float = 600.0  # an assigned node still idle after this is free again
    interval_s: float = 10.0
    options: PlacementOptions = field(default_factory=PlacementOptions)


@dataclass(frozen=True, slots=True)
class Pending:
    """A node assigned `model` that has not started it yet. After a release the node goes on
    as a new bare session of the same peer: the entry then follows that session."""

    session_id: str
    peer_id: str
    model: str
    deadline: float


@dataclass(frozen=True, slots=True)
class ControllerState:
    reference: Workload | None = None  # the workload the last plan was made for
    seen_idle: frozenset[str] = frozenset()  # idle sessions the last plan already considered
    pending: tuple[Pending, ...] = ()  # assigned, not started
    idle_since: tuple[tuple[str, float], ...] = ()  # bare, not pending sessions: since when
    deferred: int = 0  # releases the last plan wanted past max_releases: re-plan next round
    held: tuple[tuple[str, float], ...] = ()  # peers moved under reclaim: not moved until


def is_idle(rec: NodeRecord) -> bool:
    m = rec.meta
    return (rec.state == Lifecycle.JOIN and m.engine == "" and not m.models
            and m.hardware.gpu_count > 0)


def is_serving(rec: NodeRecord) -> bool:
    return rec.state == Lifecycle.SERVING and bool(rec.meta.models)


def is_reclaimable(rec: NodeRecord) -> bool:
    """A serving node the controller may release and reassign: it accepts assignments."""
    return is_serving(rec) and "assignable" in rec.meta.roles


def _tp_of(gpus: int) -> int:
    return max(t for t in TP_DEGREES if t <= max(1, gpus))


def inventory(records: Iterable[NodeRecord], perf: PerformanceModel, config: ControllerConfig,
              exclude: Iterable[str] = (), starting: Mapping[str, str] | None = None,
              held: Collection[str] = ()) -> tuple[Cluster, tuple[FixedGroup, ...], list[str]]:
    """Pools of idle nodes (plus running ones when reclaiming), fixed groups, and notes.
    `starting` (session id -> model): bare nodes assigned a model, not serving it yet; they
    count as a replica of it (fixed), not as idle capacity. `held` (peer ids): running nodes
    recently moved, fixed even when reclaiming."""
    skip = set(exclude)
    starting = starting or {}
    notes: list[str] = []
    by_shape: dict[tuple[str, int, str], list[str]] = {}
    fixed: dict[tuple[str, str, int], list[str]] = {}
    for rec in records:
        if rec.session_id in skip:
            continue
        hw = rec.meta.hardware
        start = starting.get(rec.session_id)
        free = start is None and (is_idle(rec) or (
            config.reclaim and is_reclaimable(rec) and rec.peer_id not in held))
        if not free and not is_serving(rec) and start is None:
            continue
        if hw.gpu_count > MAX_NODE_GPUS:
            notes.append(f"node {rec.session_id}: claims {hw.gpu_count} GPUs, more than "
                         f"{MAX_NODE_GPUS}; left out")
            continue
        try:
            gpu = perf.gpu(hw.gpu_model).name
        except (SchedulerError, KeyError, ValueError):
            notes.append(f"node {rec.session_id}: GPU {hw.gpu_model!r} unknown to the "
                         "performance model; left out")
            continue
        if free:
            by_shape.setdefault((gpu, hw.gpu_count, hw.interconnect), []).append(rec.session_id)
        else:
            # One engine per node: a record listing many models is one replica, of its first
            # (listing every model made one member a replica of each: nothing was placed).
            served = ([start] if start is not None else
                      [sm.id for sm in (rec.meta.models[:1] if config.exclusive_nodes
                                        else rec.meta.models)])
            for model in served:
                fixed.setdefault((model, gpu, _tp_of(hw.gpu_count)), []).append(rec.session_id)
    pools = tuple(
        Pool(f"{gpu}x{count}", gpu, len(sids), count, interconnect=link,
             exclusive_nodes=config.exclusive_nodes, session_ids=tuple(sorted(sids)))
        for (gpu, count, link), sids in sorted(by_shape.items()))
    groups = tuple(FixedGroup(m, g, tp, len(sids), tuple(sorted(sids)))
                   for (m, g, tp), sids in sorted(fixed.items()))
    return Cluster(pools), groups, notes


def drifted(ref: Workload | None, now: Workload, config: ControllerConfig) -> list[str]:
    """Models whose arrival rate moved more than the threshold since `ref`."""
    if ref is None:
        return [m.model for m in now.loads if m.arrival_rate > 0]
    out = []
    for load in now.loads:
        old = ref.get(load.model)
        base = max(old.arrival_rate if old else 0.0, config.min_rate)
        if abs(load.arrival_rate - (old.arrival_rate if old else 0.0)) / base > \
                config.drift_threshold:
            out.append(load.model)
    return out


def assignments(cluster: Cluster, placement: Placement, template: str,
                current: Mapping[str, str] | None = None) -> list[Assign]:
    """Pack each pool's groups onto its nodes; one Assign per identical (node set, engine).

    `current` (session id -> the model it serves) keeps running nodes on their model where the
    plan allows: a pool's nodes are identical, so packed node slots are matched first to the
    nodes that already serve that slot's model, then to bare nodes."""
    merged: dict[tuple[str, str, int, int, tuple[int, ...]], list[str]] = {}
    for pool in cluster.pools:
        groups = [g for g in placement.groups if g.pool == pool.name]
        per_node: dict[tuple[int, str, int], list[int]] = {}
        for slot in pack(pool, groups):
            per_node.setdefault((slot.node, slot.model, slot.tp), []).extend(slot.gpu_ids)
        models_of: dict[int, set[str]] = {}
        for node, model, _ in per_node:
            models_of.setdefault(node, set()).add(model)
        sids = list(pool.session_ids) or [f"{pool.name}/{i}" for i in range(pool.nodes)]
        sid_of = _match_nodes(sids, models_of, current or {})
        for (node, model, tp), ids in per_node.items():
            key = (model, pool.gpu_type, tp, len(ids) // tp, tuple(sorted(ids)))
            merged.setdefault(key, []).append(sid_of[node])
    return [Assign(model, gpu, tp, dp, tuple(sorted(sids)), template, ids)
            for (model, gpu, tp, dp, ids), sids in sorted(merged.items())]


def _match_nodes(sids: list[str], models_of: Mapping[int, set[str]],
                 current: Mapping[str, str]) -> dict[int, str]:
    """Node index -> session id: nodes keep their model first, then bare nodes fill in."""
    free = list(sids)
    out: dict[int, str] = {}
    for node in sorted(models_of):
        keep = next((s for s in free if current.get(s) in models_of[node]), None)
        if keep is not None:
            out[node] = keep
            free.remove(keep)
    free.sort(key=lambda s: s in current)  # bare nodes before running ones (stable)
    for node in [n for n in sorted(models_of) if n not in out] + [
            n for n in range(len(sids)) if n not in models_of]:
        out[node] = free.pop(0)
    return out


def _serves(rec: NodeRecord, model: str) -> bool:
    return is_serving(rec) and any(sm.id == model for sm in rec.meta.models)


def _pending_now(records: list[NodeRecord], pending: tuple[Pending, ...], now: float
                 ) -> tuple[Pending, ...]:
    """The entries still waiting, each bound to the bare session it covers now: its own, or
    (after a release) a bare session of its peer no other entry holds. An entry ends at its
    deadline or once its peer serves the model; one with no bare session yet (the node's new
    session has not reached this replica) waits, covering nothing."""
    started = {(r.peer_id, sm.id) for r in records if is_serving(r) for sm in r.meta.models}
    live = [p for p in pending if p.deadline > now and (p.peer_id, p.model) not in started]
    bare: dict[str, NodeRecord] = {r.session_id: r for r in records if is_idle(r)}
    held = {p.session_id for p in live if p.session_id in bare}
    out: list[Pending] = []
    for p in live:
        if p.session_id not in bare:
            sid = next((s for s in sorted(bare) if bare[s].peer_id == p.peer_id
                        and s not in held), None)
            if sid is not None:
                held.add(sid)
                p = replace(p, session_id=sid)
        out.append(p)
    return tuple(out)


def decide(records: list[NodeRecord], workload: Workload, state: ControllerState, now: float,
           perf: PerformanceModel, config: ControllerConfig
           ) -> tuple[list[Decision], ControllerState, Placement | None]:
    """One controller round. Pure: no I/O, no clock reads."""
    by_id = {r.session_id: r for r in records}
    # pending: within the deadline and not started; their bare sessions count as replicas of
    # the model they were assigned, not as idle capacity
    pending = _pending_now(records, state.pending, now)
    starting = {p.session_id: p.model for p in pending if p.session_id in by_id
                and is_idle(by_id[p.session_id])}
    bare = [r.session_id for r in records if is_idle(r) and r.session_id not in starting]
    since = dict(state.idle_since)
    idle_since = tuple((sid, since.get(sid, now)) for sid in sorted(bare))
    if config.reclaim:
        # A bare node is capacity once it has stayed bare reclaim_idle_s: one flapping
        # between bare and busy never re-plans (and so never moves) the running nodes.
        idle = frozenset(sid for sid, t in idle_since if now - t >= config.reclaim_idle_s)
    else:
        idle = frozenset(bare)
    unsettled = set(bare) - idle
    fresh = idle - state.seen_idle
    moved = drifted(state.reference, workload, config)
    # The last plan's releases were not all sent: re-plan, and keep going only while the
    # releases still wanted shrink (a plan that keeps changing its mind stops here).
    due, before = state.deferred > 0 and config.reclaim, state.deferred
    held = {peer: until for peer, until in state.held if until > now}
    state = replace(state, pending=pending, idle_since=idle_since,
                    seen_idle=state.seen_idle & idle, deferred=0,
                    held=tuple(sorted(held.items())))
    if not fresh and not moved and not due:
        return [], state, None
    if not idle and not config.reclaim:
        return [], replace(state, reference=workload), None
    loaded = Workload(tuple(m for m in workload.loads if m.arrival_rate > 0))
    cluster, fixed, notes = inventory(records, perf, config, exclude=unsettled,
                                      starting=starting, held=held)
    for note in notes:
        log.warning(note)
    if not cluster.pools or not loaded.loads:
        return [], replace(state, reference=workload, seen_idle=idle), None
    placement = get_policy(config.policy)(Problem(cluster, loaded, fixed), perf, config.options)
    current = {sid: rec.meta.models[0].id for sid, rec in by_id.items() if is_serving(rec)}
    assigns = assignments(cluster, placement, config.template,
                          current if config.reclaim else None)
    decisions: list[Decision] = []
    deferred = 0
    if config.reclaim:
        # Release every reclaimed node whose model the plan changes (or does not use), before
        # any assignment; a node the plan keeps on its model keeps its engine.
        target: dict[str, set[str]] = {}
        for a in assigns:
            for sid in a.session_ids:
                target.setdefault(sid, set()).add(a.model)
        releases = [Release(sid, sm.id, "reclaimed by the placement")
                    for pool in cluster.pools for sid in pool.session_ids
                    if is_serving(by_id[sid])
                    for sm in by_id[sid].meta.models if sm.id not in target.get(sid, set())]
        # At most max_releases nodes a round, those the plan gives a model first (then by
        # session id); the others keep their engine, and the next round re-plans the rest.
        nodes = sorted({r.session_id for r in releases},
                       key=lambda sid: (sid not in target, sid))
        later = set(nodes[max(0, config.max_releases):])
        decisions += [r for r in releases if r.session_id not in later]
        if later and (fresh or moved or len(later) < before):
            deferred = len(later)
        kept = [replace(a, session_ids=tuple(s for s in a.session_ids
                                             if not _serves(by_id[s], a.model)
                                             and s not in later))
                for a in assigns]
        assigns = [a for a in kept if a.session_ids]
    decisions += assigns
    deadline = now + config.pending_timeout_s
    started = {sid for a in assigns for sid in a.session_ids}
    if config.reclaim:  # every node moved this round: not released again for the hold
        for d in decisions:
            for sid in (d.session_id,) if isinstance(d, Release) else d.session_ids:
                held[by_id[sid].peer_id] = now + config.reclaim_hold_s
    new_state = ControllerState(
        reference=workload, seen_idle=idle - started,
        pending=pending + tuple(Pending(sid, by_id[sid].peer_id, a.model, deadline)
                                for a in assigns for sid in a.session_ids),
        idle_since=tuple((sid, t) for sid, t in idle_since if sid not in started),
        deferred=deferred, held=tuple(sorted(held.items())))
    return decisions, new_state, placement


T = TypeVar("T")


class Offload(Protocol):
    """Runs a blocking function away from the event loop (asyncio.to_thread, a process...)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


async def _inline(fn: Callable[[], T], /) -> T:
    return fn()


INLINE: Offload = _inline  # run the plan on the loop (virtual-time tests)


class FleetController:
    """Runs `decide` every `interval_s` of the injected clock and applies the decisions.

    Planning is CPU-bound for seconds (simulator estimates, then CP-SAT up to its time limit),
    so `decide` runs off the event loop, in a worker thread by default (`offload`): the
    loop keeps answering membership probes and gossip meanwhile, and the controller's node is
    not suspected mid-plan. The clock is read on the loop, before the plan starts; `decide`
    itself reads no clock. One plan at a time (rounds are sequential)."""

    def __init__(self, records: Callable[[], Iterable[NodeRecord]],
                 workload: Callable[[], Workload], executor: Executor, perf: PerformanceModel,
                 clock: Clock, config: ControllerConfig | None = None,
                 offload: Offload | None = None) -> None:
        self._records = records
        self._workload = workload
        self._executor = executor
        self._perf = perf
        self._clock = clock
        self._offload: Offload = offload or asyncio.to_thread
        self.config = config or ControllerConfig()
        self.state = ControllerState()
        self.last_placement: Placement | None = None
        self.planning = False  # a plan is being computed off the loop

    async def step(self) -> list[Decision]:
        records, workload = list(self._records()), self._workload()
        state, now, perf, config = self.state, self._clock.now(), self._perf, self.config
        self.planning = True
        try:
            decisions, self.state, placement = await self._offload(
                lambda: decide(records, workload, state, now, perf, config))
        finally:
            self.planning = False
        if placement is not None:
            self.last_placement = placement
        await self._executor.apply_all(decisions)
        return decisions

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except SchedulerError as e:  # a bad round must not stop the loop
                log.error("placement round failed: %s", e)
            await self._clock.sleep(self.config.interval_s)


__all__ = ["INLINE", "Assign", "ControllerConfig", "ControllerState", "Decision",
           "FleetController", "Group", "Offload", "Release", "decide", "inventory"]
