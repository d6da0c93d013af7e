from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

import pytest

from llmfabric.clock import SystemClock
from llmfabric.registry.records import Hardware, Lifecycle, NodeMeta, NodeRecord, ServedModel
from llmfabric.scheduler.controller import (
    INLINE,
    ControllerConfig,
    ControllerState,
    FleetController,
    decide,
    drifted,
    inventory,
)
from llmfabric.scheduler.decisions import Assign, Decision, LoggingExecutor, Release, render
from llmfabric.scheduler.options import PlacementOptions
from llmfabric.scheduler.perf import Estimate
from llmfabric.scheduler.problem import ModelLoad, Workload
from llmfabric.scheduler.standin import AnalyticStandIn
from llmfabric.testing.fake_clock import FakeClock

CFG = ControllerConfig(options=PlacementOptions(workers=2, time_limit_s=10))


def _node(sid: str, gpu: str = "A100-80GB", count: int = 4, state: Lifecycle = Lifecycle.JOIN,
          engine: str = "", models: tuple[str, ...] = (),
          roles: tuple[str, ...] = ("assignable",)) -> NodeRecord:
    meta = NodeMeta(hardware=Hardware(gpu, count, 80.0, "nvlink"), engine=engine,
                    models=tuple(ServedModel(m) for m in models), roles=roles)
    return NodeRecord(sid, f"peer-{sid}", b"k", state, 0, 1, 0.0, meta)


WL = Workload((ModelLoad("Llama-2-13b", 10, 600, 128), ModelLoad("Llama-2-7b", 5, 300, 100)))


def test_idle_nodes_get_whole_node_assignments() -> None:
    perf = AnalyticStandIn()
    records = [_node("a"), _node("b"), _node("c", "GH200"),
               _node("busy", state=Lifecycle.SERVING, engine="vllm", models=("Llama-2-13b",)),
               _node("cpu", "cpu", 0)]
    decisions, state, placement = decide(records, WL, ControllerState(), 0.0, perf, CFG)
    assert placement is not None
    assigns = [d for d in decisions if isinstance(d, Assign)]
    assert assigns and not [d for d in decisions if isinstance(d, Release)]
    nodes = [s for a in assigns for s in a.session_ids]
    assert len(nodes) == len(set(nodes))  # exclusive: one engine per node
    assert set(nodes) <= {"a", "b", "c"}  # never the running or the CPU node
    for a in assigns:
        assert a.tp * a.dp == len(a.gpu_ids) and a.template == "sim"
    assert {a.model for a in assigns} == {"Llama-2-13b", "Llama-2-7b"}
    assert {p.session_id for p in state.pending} == set(nodes)
    # Nothing changed: the next round does nothing.
    again, _state2, p2 = decide(records, WL, state, 1.0, perf, CFG)
    assert again == [] and p2 is None


def test_running_replicas_are_fixed_capacity() -> None:
    perf = AnalyticStandIn()
    records = [_node("busy", state=Lifecycle.SERVING, engine="vllm", models=("Llama-2-13b",)),
               _node("idle")]
    cluster, fixed, notes = inventory(records, perf, CFG)
    assert [p.session_ids for p in cluster.pools] == [("idle",)]
    assert fixed[0].model == "Llama-2-13b" and fixed[0].tp == 4 and fixed[0].session_ids == (
        "busy",)
    assert notes == []


def test_unknown_gpu_is_left_out_with_a_note() -> None:
    _, _, notes = inventory([_node("x", "TPU-v9")], AnalyticStandIn(), CFG)
    assert notes and "TPU-v9" in notes[0]


def test_drift_triggers_a_new_plan_and_pending_expires() -> None:
    perf = AnalyticStandIn()
    records = [_node("a"), _node("b")]
    d1, st, _ = decide(records, WL, ControllerState(), 0.0, perf, CFG)
    assert d1
    # The assigned nodes never start: after the timeout they are idle again and re-planned.
    d2, st2, _ = decide(records, WL, st, CFG.pending_timeout_s + 1, perf, CFG)
    assert d2 and {s for a in d2 if isinstance(a, Assign) for s in a.session_ids} == {"a", "b"}
    # Drift alone, with all capacity busy, records the new reference and decides nothing.
    started = [_node("a", state=Lifecycle.SERVING, engine="sim", models=("Llama-2-13b",)),
               _node("b", state=Lifecycle.SERVING, engine="sim", models=("Llama-2-7b",))]
    busier = Workload((ModelLoad("Llama-2-13b", 30, 600, 128), ModelLoad("Llama-2-7b", 5, 300,
                                                                          100)))
    assert drifted(WL, busier, CFG) == ["Llama-2-13b"]
    assert drifted(WL, WL, CFG) == []
    d3, st3, p3 = decide(started, busier, st2, 10.0, perf, CFG)
    assert d3 == [] and p3 is None and st3.reference == busier


def test_reclaim_releases_running_nodes_when_configured() -> None:
    perf = AnalyticStandIn()
    cfg = ControllerConfig(reclaim=True, options=CFG.options)
    records = [_node("a", state=Lifecycle.SERVING, engine="sim", models=("Qwen3-1.7B",)),
               _node("b", state=Lifecycle.SERVING, engine="sim", models=("Qwen3-1.7B",)),
               # serving but not accepting assignments: the controller cannot release it
               _node("own", state=Lifecycle.SERVING, engine="vllm", models=("Qwen3-1.7B",),
                     roles=())]
    wl = Workload((ModelLoad("Llama-2-13b", 10, 600, 128),))
    decisions, _, _ = decide(records, wl, ControllerState(), 0.0, perf, cfg)
    released = {d.session_id for d in decisions if isinstance(d, Release)}
    assigned = {s for d in decisions if isinstance(d, Assign) for s in d.session_ids}
    assert released and released <= {"a", "b"} and assigned <= {"a", "b"}
    # every released node is released before it is assigned
    order = [d.session_id if isinstance(d, Release) else d.session_ids for d in decisions]
    for sid in assigned & released:
        first_assign = next(i for i, o in enumerate(order) if isinstance(o, tuple) and sid in o)
        assert order.index(sid) < first_assign


def test_drift_alone_replans_idle_capacity_the_last_plan_left_unused() -> None:
    """No new idle node: only the workload moved. A node the last plan saw (and left idle)
    gets a plan again once a model's rate drifts past the threshold, not before."""
    perf = AnalyticStandIn()
    records = [_node("a", state=Lifecycle.SERVING, engine="sim", models=("Llama-2-13b",)),
               _node("c", "GH200")]
    seen = ControllerState(reference=WL, seen_idle=frozenset({"c"}))
    same = Workload((ModelLoad("Llama-2-13b", 11, 600, 128), ModelLoad("Llama-2-7b", 5, 300,
                                                                        100)))
    d0, st0, p0 = decide(records, same, seen, 5.0, perf, CFG)  # +10 %: below the threshold
    assert d0 == [] and p0 is None and st0.reference == WL
    busier = Workload((ModelLoad("Llama-2-13b", 40, 600, 128), ModelLoad("Llama-2-7b", 5, 300,
                                                                          100)))
    d1, st1, p1 = decide(records, busier, seen, 5.0, perf, CFG)
    assert p1 is not None and st1.reference == busier
    assert [s for d in d1 if isinstance(d, Assign) for s in d.session_ids] == ["c"]
    assert any(g.fixed and g.model == "Llama-2-13b" for g in p1.groups)  # "a" takes load too


def test_drift_alone_replans_running_nodes_when_reclaiming() -> None:
    perf = AnalyticStandIn()
    cfg = ControllerConfig(reclaim=True, options=CFG.options)
    records = [_node(s, state=Lifecycle.SERVING, engine="sim", models=("Llama-2-7b",))
               for s in ("a", "b", "c")]
    state = ControllerState(reference=Workload((ModelLoad("Llama-2-7b", 20, 300, 100),)))
    steady = Workload((ModelLoad("Llama-2-7b", 21, 300, 100),))
    assert decide(records, steady, state, 1.0, perf, cfg)[0] == []
    moved = Workload((ModelLoad("Llama-2-7b", 2, 300, 100), ModelLoad("Llama-2-13b", 30, 600,
                                                                        128)))
    decisions, _, placement = decide(records, moved, state, 1.0, perf, cfg)
    assert placement is not None
    assert {d.model for d in decisions if isinstance(d, Assign)} == {"Llama-2-13b"}
    assert {d.model for d in decisions if isinstance(d, Release)} == {"Llama-2-7b"}
    # exactly the nodes that change model are released; a node the plan keeps on
    # Llama-2-7b keeps its engine (nodes of a pool are interchangeable)
    released = {d.session_id for d in decisions if isinstance(d, Release)}
    assigned = {s for d in decisions if isinstance(d, Assign) for s in d.session_ids}
    assert released == assigned and 1 <= len(released) < 3  # 7b still has load: kept


def test_render_templates() -> None:
    a = Assign("Llama-2-13b", "A100-80GB", 2, 2, ("s",), "vllm", (0, 1, 2, 3))
    assert render(a, 9000) == ["vllm", "serve", "Llama-2-13b", "--tensor-parallel-size", "2",
                               "--data-parallel-size", "2", "--port", "9000"]
    sim = Assign("Llama-2-13b", "A100-80GB", 4, 1, ("s",), "sim", (0, 1, 2, 3))
    assert render(sim, 1)[:3] == ["llmfabric", "engine", "sim"]
    # the simulated engine gets the DP degree too: dp replicas, as many as the plan counted
    sim_dp = Assign("Llama-2-7b", "A100-80GB", 1, 4, ("s",), "sim", (0, 1, 2, 3))
    argv = render(sim_dp, 1)
    assert argv[argv.index("--tp") + 1] == "1" and argv[argv.index("--dp") + 1] == "4"


async def test_loop_runs_on_virtual_time() -> None:
    clock = FakeClock()
    records = [_node("a")]
    ex = LoggingExecutor()
    ctl = FleetController(lambda: records, lambda: WL, ex, AnalyticStandIn(), clock,
                          ControllerConfig(interval_s=5, options=CFG.options), offload=INLINE)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await clock.advance(0)
    assert len(ex.applied) >= 1 and ctl.last_placement is not None
    first = len(ex.applied)
    records.append(_node("b", "GH200"))  # a new idle node appears
    await clock.advance(5)
    assert len(ex.applied) > first
    assert any("b" in d.session_ids for d in ex.applied if isinstance(d, Assign))
    stop.set()
    await clock.advance(5)
    await asyncio.wait_for(task, 1)


class _BlockingPerf(AnalyticStandIn):
    """Estimates block (in the planning thread) until the test lets them go."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.entered = threading.Event()

    def estimate(self, model: str, gpu_type: str, tp: int, arrival_rate: float,
                 mean_in: float, mean_out: float) -> Estimate:
        self.entered.set()
        if not self.gate.wait(10):
            raise RuntimeError("the test never released the planner")
        return super().estimate(model, gpu_type, tp, arrival_rate, mean_in, mean_out)


async def test_the_event_loop_keeps_serving_while_a_plan_is_computed() -> None:
    """decide() runs off the loop: while it is stuck in the performance model, other tasks
    (membership probes, gossip) still run; the plan lands once it finishes."""
    gate = threading.Event()
    perf = _BlockingPerf(gate)
    ex = LoggingExecutor()
    ctl = FleetController(lambda: [_node("a")], lambda: WL, ex, perf, SystemClock(), CFG)
    step = asyncio.create_task(ctl.step())
    entered = await asyncio.to_thread(perf.entered.wait, 10)
    assert entered
    assert ctl.planning
    ticks = 0
    for _ in range(20):  # the loop is free: a task that needs it keeps running
        await asyncio.sleep(0.001)
        ticks += 1
    assert ticks == 20 and not step.done()
    gate.set()
    decisions = await asyncio.wait_for(step, 30)
    assert decisions and ex.applied == decisions and not ctl.planning


def _assigned(decisions: list[Decision]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for d in decisions:
        if isinstance(d, Assign):
            for sid in d.session_ids:
                out.setdefault(d.model, set()).add(sid)
    return out


@pytest.mark.hostile
def test_an_idle_node_claiming_a_huge_gpu_count_is_left_out() -> None:
    """gpu_count is the record's claim (up to 2**20). An idle node claiming 4,096 GPUs took a
    whole model (the honest nodes got only the other one), and one claiming 2**16 or more
    kept the plan busy for minutes (2**20: gigabytes), so no round ever finished. A node
    cannot take GPU indexes past 64 (peer_api), so nodes claiming more are left out."""
    perf = AnalyticStandIn()
    honest = [_node("a"), _node("b")]
    for count in (4096, 1 << 20):
        t0 = time.monotonic()
        decisions, _, _ = decide([*honest, _node("evil", count=count)], WL, ControllerState(),
                                 0.0, perf, CFG)
        assert time.monotonic() - t0 < 30
        placed = _assigned(decisions)
        assert all("evil" not in sids for sids in placed.values())
        assert set(placed) == {"Llama-2-13b", "Llama-2-7b"}


@pytest.mark.hostile
def test_a_serving_node_listing_every_model_counts_as_one_replica() -> None:
    """A member that is SERVING (not ours, not assignable) and lists every model counted as
    a whole replica of each: the controller placed nothing on the idle nodes. With one engine
    per node it counts as one replica, of the model it lists first."""
    perf = AnalyticStandIn()
    wl = Workload((ModelLoad("Llama-2-13b", 2, 600, 128), ModelLoad("Llama-2-7b", 2, 300, 100)))
    evil = _node("evil", count=8, state=Lifecycle.SERVING, engine="vllm",
                 models=("Llama-2-13b", "Llama-2-7b"), roles=())
    decisions, _, placement = decide([_node("a"), _node("b"), evil], wl, ControllerState(), 0.0,
                                     perf, CFG)
    assert placement is not None
    assert "Llama-2-7b" in _assigned(decisions)  # the second model is placed on ours
    assert [g.model for g in placement.groups if g.fixed] == ["Llama-2-13b"]


def _serving(sid: str, model: str, peer: str | None = None, **kw: object) -> NodeRecord:
    rec = _node(sid, state=Lifecycle.SERVING, engine="sim", models=(model,), **kw)  # type: ignore[arg-type]
    return rec if peer is None else NodeRecord(sid, peer, b"k", rec.state, 0, 1, 0.0, rec.meta)


def _rounds(records: list[NodeRecord], wl: Workload, cfg: ControllerConfig, rounds: int,
            ) -> list[list[Decision]]:
    """Run `rounds` rounds 10 s apart. A released node goes on as a new bare session of its
    peer (`<sid>+`); engines never finish starting, so assigned nodes stay bare."""
    perf = AnalyticStandIn()
    state = ControllerState()
    out = []
    for i in range(rounds):
        decisions, state, _ = decide(records, wl, state, 10.0 * i, perf, cfg)
        out.append(decisions)
        for d in decisions:
            if isinstance(d, Release):
                old = next(r for r in records if r.session_id == d.session_id)
                records = [r for r in records if r is not old]
                records.append(NodeRecord(f"{old.session_id}+", old.peer_id, b"k",
                                          Lifecycle.JOIN, 0, 1, 0.0, _node("x").meta))
    return out


@pytest.mark.hostile
def test_reclaim_releases_at_most_max_releases_a_round_and_later_rounds_finish_the_plan(
) -> None:
    """A re-plan released every node whose model it changed, all in one round (a shifted
    workload, or one new idle node, could take every running replica down at once). Now at
    most max_releases a round; the next rounds re-plan, counting the nodes already assigned
    but not started as replicas of their new model (never assigning them again)."""
    cfg = ControllerConfig(reclaim=True, options=CFG.options)
    assert cfg.max_releases == 1
    records = [_serving(s, "Llama-2-7b") for s in ("a", "b", "c", "d")]
    wl = Workload((ModelLoad("Llama-2-13b", 40, 600, 128), ModelLoad("Llama-2-7b", 0.5, 300,
                                                                       100)))
    rounds = _rounds(records, wl, cfg, 6)
    releases = [[d.session_id for d in r if isinstance(d, Release)] for r in rounds]
    assigned = [[s for d in r if isinstance(d, Assign) for s in d.session_ids] for r in rounds]
    assert all(len(r) <= 1 for r in releases), releases
    moved = [sid for r in releases for sid in r]
    assert len(moved) >= 2 and len(set(moved)) == len(moved)  # the plan went on, once each
    for rel, ass in zip(releases, assigned, strict=True):
        assert ass == rel  # only the released node is assigned; never a pending bare session
    assert rounds[-1] == [] and rounds[-2] == []  # the plan is done: nothing more moves
    # max_releases=3 moves as many nodes, in fewer rounds
    wide = _rounds(list(records), wl, replace(cfg, max_releases=3), 6)
    assert len([d for r in wide for d in r if isinstance(d, Release)]) == len(moved)


@pytest.mark.hostile
async def test_a_node_flapping_between_bare_and_busy_never_moves_running_nodes() -> None:
    """With --reclaim every idle node the last plan had not seen re-planned the running
    nodes, so one member flapping between bare and busy (a new session each time) could have
    them released round after round. A bare node is capacity (and a reason to re-plan) only
    once it has stayed bare reclaim_idle_s of the controller's clock."""
    clock = FakeClock()
    wl = Workload((ModelLoad("Llama-2-7b", 5, 300, 100),))
    running = [_serving("a", "Llama-2-7b"), _serving("b", "Llama-2-7b")]
    calls = [0]

    def records() -> list[NodeRecord]:
        calls[0] += 1
        n = calls[0]
        if n % 2:  # bare, under a new session each time
            return [*running, _node(f"flap-{n}", "GH200", count=8)]
        return [*running, _serving(f"flap-{n}", "Llama-2-13b", peer="peer-flap", roles=())]

    ex = LoggingExecutor()
    cfg = ControllerConfig(reclaim=True, interval_s=10, reclaim_idle_s=30,
                           options=CFG.options)
    ctl = FleetController(records, lambda: wl, ex, AnalyticStandIn(), clock, cfg,
                          offload=INLINE)
    ctl.state = ControllerState(reference=wl)  # the running nodes already fit the workload
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await clock.advance(0)
    for _ in range(30):
        await clock.advance(10)
    assert calls[0] >= 30
    assert ex.applied == [] and ctl.last_placement is None  # never even re-planned
    # a node that stays bare past reclaim_idle_s is capacity: planned once, then settled
    steady = _node("new", "GH200", count=8)
    ctl._records = lambda: [*running, steady]
    for _ in range(3):
        await clock.advance(10)
    assert ctl.last_placement is None  # 20 s bare: not yet
    await clock.advance(10)
    await clock.advance(10)
    assert ctl.last_placement is not None
    stop.set()
    await clock.advance(10)
    await asyncio.wait_for(task, 1)


@pytest.mark.hostile
async def test_demand_swinging_every_round_moves_each_node_at_most_once_per_hold() -> None:
    """An ingress member that swings its published demand past the drift threshold every
    round re-planned the running nodes every round under --reclaim: a node was released,
    reassigned, and released again a round or two later (each move an engine restart). A
    node the controller moved is held (fixed capacity of its model) for reclaim_hold_s."""
    from llmfabric.registry.records import ModelDemand
    from llmfabric.scheduler.observed import observed_workload

    clock = FakeClock()
    meta = _node("x").meta
    fleet = {f"peer-{s}": _serving(s, "Llama-2-7b", peer=f"peer-{s}") for s in "abcd"}
    swings = [0]

    def ingress() -> NodeRecord:
        swings[0] += 1
        heavy, light = (("Llama-2-13b", "Llama-2-7b") if swings[0] % 2
                        else ("Llama-2-7b", "Llama-2-13b"))
        demand = (ModelDemand(heavy, 40.0, 600, 128), ModelDemand(light, 0.5, 300, 100))
        m = NodeMeta(roles=("ingress",), demand=demand)
        return NodeRecord("ing", "peer-ing", b"k", Lifecycle.SERVING, 0, 1, clock.now(), m)

    moves: dict[str, list[float]] = {}
    n = [0]

    class Fleet(LoggingExecutor):
        """Applies decisions at once: a released node comes back bare (a new session of its
        peer), an assigned one serves its model (a new session again)."""

        async def apply_all(self, decisions: list[Decision]) -> None:
            await super().apply_all(decisions)
            peer_of = {r.session_id: p for p, r in fleet.items()}
            for d in decisions:
                n[0] += 1
                if isinstance(d, Release):
                    peer = peer_of[d.session_id]
                    moves.setdefault(peer, []).append(clock.now())
                    fleet[peer] = NodeRecord(f"{peer}-{n[0]}", peer, b"k", Lifecycle.JOIN, 0,
                                             1, 0.0, meta)
                else:
                    for sid in d.session_ids:
                        peer = peer_of[sid]
                        fleet[peer] = _serving(f"{peer}-{n[0]}", d.model, peer=peer)

    def records() -> list[NodeRecord]:
        return list(fleet.values())

    cfg = ControllerConfig(reclaim=True, interval_s=10, policy="greedy", reclaim_hold_s=300,
                           options=CFG.options)
    ex = Fleet()
    ctl = FleetController(records, lambda: observed_workload([*records(), ingress()])[0], ex,
                          AnalyticStandIn(), clock, cfg, offload=INLINE)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await clock.advance(0)
    for _ in range(90):  # 900 s: three holds
        await clock.advance(10)
    stop.set()
    await clock.advance(10)
    await asyncio.wait_for(task, 1)
    assert swings[0] >= 90 and moves  # the swings did move nodes
    for peer, times in moves.items():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= cfg.reclaim_hold_s for g in gaps), (peer, times)
    assert any(len(t) >= 2 for t in moves.values())  # a hold ends: the node may move again
