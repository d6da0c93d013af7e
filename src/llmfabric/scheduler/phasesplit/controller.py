"""When lightweight rescheduling runs, in the fleet (ThunderServe App. E; COMPANIONS.md §1.4).

Triggers: (1) a node holding plan GPUs is DOWN, LEFT, gone from the registry or suspected
(the heartbeat timeout of the paper); (2) an obvious workload shift: the arrival rate, the
mean prompt or the mean output length moved more than `drift_threshold` (the fleet
controller's 25 %) from the workload the plan was last made for. A loss acts at once; a drift
waits out `cooldown_s` after the last reschedule so a noisy estimate cannot flap the phases.

`pd_decide` is pure (records, workload, state, time in; decisions and state out), as the fleet
controller's `decide` is; `PDController` runs it on an injected clock and hands the decisions
to an Executor: SetRole naming the sessions that hold the flipped groups, then one SetRouting
whose X/Y are keyed by the session each replica is entered through.

Lost GPUs stay out of the plan: lightweight rescheduling only removes replicas, so a node that
comes back rejoins through a full re-plan (`llmfabric plan pd`), not here.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from llmfabric.clock import Clock
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.decisions import SetRole, SetRouting
from llmfabric.scheduler.errors import SchedulerError
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import PDWorkload
from llmfabric.scheduler.phasesplit.reschedule import RescheduleDecision, lightweight
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.scheduler.phasesplit.controller")


class PDExecutor(Protocol):
    async def apply(self, decision: RescheduleDecision) -> None:
        """Flip engines' roles (SetRole) or publish routing (SetRouting)."""
        ...


@dataclass(frozen=True, slots=True)
class PDBinding:
    """Which session holds which planner GPU ids (from the Assigns that deployed the plan)."""

    gpus: Mapping[str, tuple[int, ...]]

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for sid, ids in self.gpus.items():
            if seen & set(ids):
                raise SchedulerError(f"GPU ids {sorted(seen & set(ids))} bound twice ({sid})")
            seen |= set(ids)

    def session_of(self, gpu: int) -> str | None:
        return next((s for s, ids in self.gpus.items() if gpu in ids), None)

    def sessions_of(self, gpus: Iterable[int]) -> tuple[str, ...]:
        return tuple(sorted({s for g in gpus if (s := self.session_of(g)) is not None}))


@dataclass(frozen=True, slots=True)
class PDControllerConfig:
    drift_threshold: float = 0.25
    cooldown_s: float = 60.0  # between drift-triggered reschedules
    interval_s: float = 10.0


@dataclass(frozen=True, slots=True)
class PDControllerState:
    plan: PDPlan
    reference: PDWorkload  # the workload the plan was last made for
    lost: frozenset[int] = frozenset()  # GPUs already taken out of the plan
    last_at: float = -math.inf
    history: tuple[tuple[float, str], ...] = field(default=())  # (time, why) per reschedule


def lost_gpus(records: Iterable[tuple[NodeRecord, bool]], binding: PDBinding
              ) -> frozenset[int]:
    """GPUs of bound sessions that are absent, DOWN, LEFT or suspected."""
    live = {r.session_id for r, suspected in records
            if r.state in (Lifecycle.JOIN, Lifecycle.SERVING) and not suspected}
    return frozenset(g for sid, ids in binding.gpus.items() if sid not in live for g in ids)


def drift(ref: PDWorkload, now: PDWorkload, threshold: float) -> list[str]:
    """What moved beyond `threshold` (relative): "rate", "mean_in", "mean_out"."""
    out = []
    for name, a, b in (("rate", ref.rate, now.rate), ("mean_in", ref.mean_in, now.mean_in),
                       ("mean_out", ref.mean_out, now.mean_out)):
        if abs(b - a) / max(a, 1e-9) > threshold:
            out.append(name)
    return out


def bind_decisions(decisions: list[RescheduleDecision], plan: PDPlan, binding: PDBinding
                   ) -> list[RescheduleDecision]:
    """Name sessions in the planner's decisions: who flips, and the routing's sessions."""
    out: list[RescheduleDecision] = []
    for d in decisions:
        if isinstance(d, SetRole):
            out.append(replace(d, session_ids=binding.sessions_of(d.gpu_ids)))
        else:
            entry = [binding.session_of(r.gpus[0]) or "" for r in plan.replicas("prefill")]
            exit_ = [binding.session_of(r.gpus[0]) or "" for r in plan.replicas("decode")]
            out.append(replace(d, prefill_sessions=tuple(entry), decode_sessions=tuple(exit_)))
    return out


def current_routing(plan: PDPlan, binding: PDBinding) -> SetRouting:
    """The plan's own X/Y as a session-keyed SetRouting (published when the controller
    starts, before any reschedule)."""
    routing = SetRouting(plan.plan_id or "plan", tuple(float(v) for v in plan.routing.x),
                         tuple(tuple(float(v) for v in row) for row in plan.routing.y))
    bound = bind_decisions([routing], plan, binding)[0]
    assert isinstance(bound, SetRouting)
    return bound


def pd_decide(records: list[tuple[NodeRecord, bool]], workload: PDWorkload | None,
              state: PDControllerState, now: float, binding: PDBinding,
              config: PDControllerConfig) -> tuple[list[RescheduleDecision], PDControllerState]:
    """One round. Pure: no I/O, no clock reads."""
    lost = lost_gpus(records, binding) | state.lost
    new_loss = lost - state.lost
    moved = drift(state.reference, workload, config.drift_threshold) \
        if workload is not None else []
    if not new_loss and not (moved and now - state.last_at >= config.cooldown_s):
        return [], state
    why = ", ".join(([f"lost GPUs {sorted(new_loss)}"] if new_loss else [])
                    + ([f"workload drift ({', '.join(moved)})"] if moved else []))
    wl = workload if moved and workload is not None else state.reference
    plan, decisions = lightweight(state.plan, lost_gpus=lost, workload=wl)
    log.info("lightweight reschedule (%s): plan %s -> %s, %d flip(s)", why,
             state.plan.plan_id, plan.plan_id, sum(isinstance(d, SetRole) for d in decisions))
    return bind_decisions(decisions, plan, binding), PDControllerState(
        plan, wl, lost, now, (*state.history, (now, why)))


class PDController:
    """Runs `pd_decide` every `interval_s` of the injected clock and applies the decisions."""

    def __init__(self, plan: PDPlan, binding: PDBinding,
                 records: Callable[[], Iterable[tuple[NodeRecord, bool]]],
                 workload: Callable[[], PDWorkload | None], executor: PDExecutor, clock: Clock,
                 config: PDControllerConfig | None = None) -> None:
        self.binding = binding
        self.state = PDControllerState(plan, plan.workload)
        self._records, self._workload = records, workload
        self._executor, self._clock = executor, clock
        self.config = config or PDControllerConfig()

    async def step(self) -> list[RescheduleDecision]:
        decisions, self.state = pd_decide(list(self._records()), self._workload(), self.state,
                                          self._clock.now(), self.binding, self.config)
        for d in decisions:
            await self._executor.apply(d)
        return decisions

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except SchedulerError as e:  # e.g. too little left: a full re-plan is needed
                log.error("lightweight reschedule failed: %s", e)
            except (ValueError, RuntimeError) as e:  # an executor's failure: the next round
                log.error("applying the reschedule failed: %s", e)
            await self._clock.sleep(self.config.interval_s)
