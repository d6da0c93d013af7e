"""When the lightweight reschedule runs in the fleet: node loss (DOWN, LEFT, gone, suspected)
at once, workload drift beyond 25 % after a cooldown; decisions name sessions; the loop runs
on the fake clock."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric import sim
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.scheduler.decisions import SetRole, SetRouting
from llmfabric.scheduler.errors import SchedulerError
from llmfabric.scheduler.phasesplit.controller import (
    PDBinding,
    PDController,
    PDControllerConfig,
    PDControllerState,
    drift,
    lost_gpus,
    pd_decide,
)
from llmfabric.scheduler.phasesplit.groups import Group, canonical
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.reschedule import RescheduleDecision
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances
from llmfabric.testing.fake_clock import FakeClock

from ..routing.conftest import make_record

MODEL = sim.get_model("llama-3.1-8b")
BINDING = PDBinding({f"n{i}": tuple(range(4 * i, 4 * i + 4)) for i in range(4)})
CFG = PDControllerConfig(cooldown_s=60.0, interval_s=10.0)


@pytest.fixture(scope="module")
def plan() -> PDPlan:
    topo = cloud_instances([("A40", 4), ("RTX-3090-Ti", 4), ("RTX-A5000", 4),
                            ("RTX-A6000", 4)], inter_gbps=(5, 40), seed=2)
    wl = PDWorkload.from_means(12, 1000, 100, slo=sim.SLO(ttft_s=1.5, tpot_s=0.05))
    start = canonical([Group(frozenset(range(0, 4)), "decode"),
                       Group(frozenset(range(4, 8)), "decode"),
                       Group(frozenset(range(8, 12)), "prefill"),
                       Group(frozenset(range(12, 16)), "prefill")])
    return tabu_search(CloudCluster.from_topology(topo), MODEL, wl, TabuOptions(n_step=0),
                       start=start)


def fleet(**states: Lifecycle | str) -> list[tuple[NodeRecord, bool]]:
    """n0..n3 SERVING unless given a Lifecycle, "suspected" or "gone"."""
    out = []
    for i in range(4):
        s = states.get(f"n{i}", Lifecycle.SERVING)
        if s == "gone":
            continue
        state = s if isinstance(s, Lifecycle) else Lifecycle.SERVING
        out.append((make_record(f"n{i}", state=state), s == "suspected"))
    return out


def test_lost_gpus_and_drift_rules(plan: PDPlan) -> None:
    assert lost_gpus(fleet(), BINDING) == frozenset()
    assert lost_gpus(fleet(n1="suspected", n2=Lifecycle.DOWN, n3="gone"), BINDING) == \
        frozenset(range(4, 16))
    assert lost_gpus(fleet(n0=Lifecycle.LEFT), BINDING) == frozenset(range(4))
    ref = plan.workload
    assert drift(ref, ref, 0.25) == []
    assert drift(ref, ref.scaled(ref.rate * 1.2), 0.25) == []
    assert drift(ref, ref.scaled(ref.rate * 1.3), 0.25) == ["rate"]
    longer = PDWorkload.from_means(12, 1000, 200, slo=ref.slo)
    assert drift(ref, longer, 0.25) == ["mean_out"]
    with pytest.raises(SchedulerError):
        PDBinding({"a": (1, 2), "b": (2, 3)})


def test_a_lost_decode_instance_reschedules_at_once_and_only_once(plan: PDPlan) -> None:
    state = PDControllerState(plan, plan.workload)
    assert pd_decide(fleet(), plan.workload, state, 0.0, BINDING, CFG) == ([], state)
    decode_sessions = BINDING.sessions_of(g for grp in plan.groups if grp.phase == "decode"
                                          for g in grp.gpus)
    assert decode_sessions == ("n0", "n1")
    records = fleet(n0="suspected", n1=Lifecycle.LEFT)  # both decode instances gone
    decisions, state2 = pd_decide(records, plan.workload, state, 5.0, BINDING, CFG)
    flips = [d for d in decisions if isinstance(d, SetRole)]
    assert flips and all(d.role == "decode" for d in flips)
    assert {s for d in flips for s in d.session_ids} <= {"n2", "n3"}
    routing = decisions[-1]
    assert isinstance(routing, SetRouting) and routing.plan_id == state2.plan.plan_id
    assert len(routing.prefill_sessions) == len(routing.x) == state2.plan.n_prefill
    assert set(routing.prefill_sessions) | set(routing.decode_sessions) <= {"n2", "n3"}
    assert state2.lost == frozenset(range(8)) and "lost GPUs" in state2.history[-1][1]
    # the same loss seen again: nothing to do (no flapping)
    assert pd_decide(records, plan.workload, state2, 6.0, BINDING, CFG)[0] == []


def test_drift_waits_out_the_cooldown_a_loss_does_not(plan: PDPlan) -> None:
    state = PDControllerState(plan, plan.workload)
    busier = plan.workload.scaled(plan.workload.rate * 1.5)
    decisions, state = pd_decide(fleet(), busier, state, 100.0, BINDING, CFG)
    assert decisions and state.reference is busier and state.last_at == 100.0
    busiest = plan.workload.scaled(plan.workload.rate * 2.5)
    assert pd_decide(fleet(), busiest, state, 130.0, BINDING, CFG)[0] == []  # cooldown
    assert pd_decide(fleet(n3="gone"), busiest, state, 130.0, BINDING, CFG)[0]  # a loss acts
    assert pd_decide(fleet(), busiest, state, 161.0, BINDING, CFG)[0]  # after the cooldown


class Recorder:
    def __init__(self) -> None:
        self.applied: list[tuple[float, RescheduleDecision]] = []
        self.clock: FakeClock | None = None

    async def apply(self, decision: RescheduleDecision) -> None:
        assert self.clock is not None
        self.applied.append((self.clock.now(), decision))


async def test_the_loop_on_the_fake_clock_reacts_within_one_interval(plan: PDPlan) -> None:
    clock = FakeClock()
    records = fleet()
    rec = Recorder()
    rec.clock = clock
    ctl = PDController(plan, BINDING, lambda: records, lambda: None, rec, clock, CFG)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await clock.advance(35.0)
    assert rec.applied == []
    records = fleet(n0=Lifecycle.DOWN)  # a node goes DOWN at t=35
    await clock.run_until(lambda: bool(rec.applied), within=20.0, step=1.0)
    assert 35.0 <= rec.applied[0][0] <= 45.0
    assert isinstance(rec.applied[-1][1], SetRouting)
    assert ctl.state.lost == frozenset(range(4))
    n = len(rec.applied)
    await clock.advance(100.0)
    assert len(rec.applied) == n  # nothing new: no more rounds act
    records = fleet(n0=Lifecycle.DOWN, n1="gone", n2="gone")  # too little left
    await clock.advance(20.0)  # the round fails (logged), the loop keeps running
    assert not task.done()
    stop.set()
    await clock.advance(20.0)
    await asyncio.wait_for(task, 5)
