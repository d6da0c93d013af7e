"""The PD controller across the fabric, on the fake clock: plan GPUs bound to live sessions
from the registry, the ingresses' observed workload, and the controller loop driving a
`PeerPDExecutor` whose role flips go through the real peer API and node handler (signed)
and whose routing plan becomes the controller's record item that an ingress's feed installs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from llmfabric import sim
from llmfabric.clock import SystemClock
from llmfabric.controller.pd_executor import PeerPDExecutor
from llmfabric.identity import NodeKey
from llmfabric.net import HandlerResponse, PeerRequest
from llmfabric.net.messages import BodyStream
from llmfabric.node.engine_role import flip_role
from llmfabric.node.serve.peer_api import PeerApi
from llmfabric.registry.records import (
    Lifecycle,
    ModelDemand,
    ModelRole,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.routing.pd_plan import PlanFeed, decode_plan
from llmfabric.scheduler.decisions import SetRole, SetRouting
from llmfabric.scheduler.errors import SchedulerError
from llmfabric.scheduler.phasesplit.binding import (
    bind_sessions,
    observed_pd_workload,
    parse_gpu_ids,
)
from llmfabric.scheduler.phasesplit.controller import (
    PDController,
    PDControllerConfig,
    current_routing,
)
from llmfabric.scheduler.phasesplit.groups import Group, canonical
from llmfabric.scheduler.phasesplit.plan import PDPlan
from llmfabric.scheduler.phasesplit.problem import CloudCluster, PDWorkload, TabuOptions
from llmfabric.scheduler.phasesplit.tabu import tabu_search
from llmfabric.sim.topology import cloud_instances
from llmfabric.testing.fake_clock import FakeClock

from ..node.test_pd_flip import NODE, _dataplane
from ..routing.conftest import make_record

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def plan() -> PDPlan:
    """Four one-A40 instances: GPUs 0, 1 prefill, 2, 3 decode."""
    topo = cloud_instances([("A40", 1)] * 4, inter_gbps=(10, 40), seed=1)
    wl = PDWorkload.from_means(8, 300, 600, slo=sim.SLO(ttft_s=2.0, tpot_s=0.1))
    start = canonical([Group(frozenset({0}), "prefill"), Group(frozenset({1}), "prefill"),
                       Group(frozenset({2}), "decode"), Group(frozenset({3}), "decode")])
    return tabu_search(CloudCluster.from_topology(topo), sim.get_model(MODEL), wl,
                       TabuOptions(n_step=0), start=start)


def node_record(sid: str, role: str, gpu: str = "A40", label: str = "",
                state: Lifecycle = Lifecycle.SERVING) -> NodeRecord:
    rec = make_record(sid, models=(ServedModel(MODEL, role=ModelRole(role)),), gpu=gpu,
                      state=state)
    labels = (("pd.gpus", label),) if label else ()
    return dataclasses.replace(rec, meta=dataclasses.replace(rec.meta, labels=labels))


def test_parse_gpu_ids() -> None:
    assert parse_gpu_ids("0-3,5") == (0, 1, 2, 3, 5)
    for bad in ("", "a", "3-1", "-1", "0,0", "0-99999"):
        with pytest.raises(SchedulerError):
            parse_gpu_ids(bad)


def test_binding_by_label_then_by_role_and_gpu_type(plan: PDPlan) -> None:
    records = [node_record("d-b", "decode"), node_record("d-a", "decode"),
               node_record("p-x", "prefill", label="1"),
               node_record("p-y", "prefill"), node_record("p-h100", "prefill", gpu="H100"),
               node_record("d-gone", "decode", state=Lifecycle.LEFT)]
    b = bind_sessions(plan, records, MODEL)
    # p-x holds GPU 1 by label; the other prefill replica (GPU 0) takes p-y (A40), never the
    # H100 node; decode replicas (GPUs 2, 3) go to d-a, d-b in session order
    assert b.gpus == {"p-x": (1,), "p-y": (0,), "d-a": (2,), "d-b": (3,)}
    assert bind_sessions(plan, records, "other-model").gpus == {}


@pytest.mark.hostile
def test_labels_are_claims_the_binding_checks(plan: PDPlan) -> None:
    """Any member can label itself `pd.gpus=...`: an RTX-3090 node serving both phases took
    a prefill replica (every prompt) with `pd.gpus=0`, or all four GPUs with `0-3`, and a
    label out of range or overlapping another stopped the controller from starting."""
    honest = [node_record("p-a", "prefill"), node_record("p-b", "prefill"),
              node_record("d-a", "decode"), node_record("d-b", "decode")]
    want = {"p-a": (0,), "p-b": (1,), "d-a": (2,), "d-b": (3,)}
    for label, gpu in (("0", "RTX-3090"), ("0-3", "A40"), ("7", "A40"), ("x", "A40")):
        notes: list[str] = []
        thief = node_record("a-thief", "both", gpu=gpu, label=label)
        assert bind_sessions(plan, [thief, *honest], MODEL, notes=notes).gpus == want
        assert len(notes) == 1 and "a-thief" in notes[0]
    # a label contested by two sessions binds neither by label
    notes = []
    clash = [node_record("a", "prefill", label="0"), node_record("b", "decode", label="0")]
    assert bind_sessions(plan, clash, MODEL, notes=notes).gpus == {}
    assert len(notes) == 2
    # with a trust check (the CLI: the controller's verified provider), others are not read
    thief = node_record("a-thief", "prefill", label="0")
    b = bind_sessions(plan, [thief, *honest], MODEL,
                      trusted=lambda r: r.session_id != "a-thief")
    assert b.gpus == want


def test_observed_workload_sums_the_ingresses(plan: PDPlan) -> None:
    def ingress(sid: str, *demand: ModelDemand, roles: tuple[str, ...] = ("ingress",)
                ) -> NodeRecord:
        rec = make_record(sid, models=())
        rec = dataclasses.replace(rec, peer_id=f"peer-{sid}")
        return dataclasses.replace(rec, meta=dataclasses.replace(rec.meta, demand=demand,
                                                                 roles=roles))

    assert observed_pd_workload([ingress("i")], MODEL, plan) is None
    wl = observed_pd_workload([ingress("i1", ModelDemand(MODEL, 3.0, 100, 10)),
                               ingress("i2", ModelDemand(MODEL, 1.0, 500, 50),
                                       ModelDemand("other", 9.0, 5, 5))], MODEL, plan)
    assert wl is not None and wl.rate == 4.0 and wl.slo == plan.workload.slo
    assert wl.mean_in == pytest.approx(200, rel=0.2) and wl.mean_out == pytest.approx(20, rel=0.2)
    assert observed_pd_workload([ingress("i", ModelDemand(MODEL, 2.0, 0, 0))], MODEL,
                                plan) is None  # no usage seen yet
    # Demand is a claim: a plain member's 1e12 req/s made every reschedule fail (its LP had
    # no solution), so failover stopped for as long as it published. Only ingress records
    # count, each capped (scheduler/observed.py), and `trusted` on top.
    liar = ingress("liar", ModelDemand(MODEL, 1e12, 100, 10), roles=())
    honest = ingress("i1", ModelDemand(MODEL, 3.0, 100, 10))
    wl = observed_pd_workload([liar, honest], MODEL, plan)
    assert wl is not None and wl.rate == 3.0
    loud = ingress("loud", ModelDemand(MODEL, 1e12, 100, 10))
    wl = observed_pd_workload([loud, honest], MODEL, plan)
    assert wl is not None and wl.rate == 10_003.0
    wl = observed_pd_workload([loud, honest], MODEL, plan,
                              trusted=lambda r: r.session_id != "loud")
    assert wl is not None and wl.rate == 3.0


class FakeNode:
    """The node side of a flip: what flip_role uses (see tests/unit/node/test_pd_flip.py)."""

    def __init__(self, sid: str, role: ModelRole, controllers: tuple[str, ...]) -> None:
        from types import SimpleNamespace

        self.role = role
        meta = NodeMeta(engine="sim", models=(ServedModel(MODEL, role=role),))
        self.agent = SimpleNamespace(session_id=sid,
                                     record=SimpleNamespace(state=Lifecycle.SERVING, meta=meta))
        self.session, self.session_id, self.stopping = self, sid, False
        self.config = SimpleNamespace(accept_assignments=True, controllers=controllers)
        self.engine = SimpleNamespace(supervisor=self)

    async def set_role(self, role: ModelRole) -> None:
        self.role = role

    async def model_roles(self) -> dict[str, ModelRole]:
        return {MODEL: self.role}

    def meta(self, **changes: Any) -> NodeMeta:
        meta: NodeMeta = self.agent.record.meta
        return dataclasses.replace(meta, **changes)

    def update_self(self, meta: NodeMeta) -> None:
        self.agent.record.meta = meta


class _Resp:
    def __init__(self, r: HandlerResponse) -> None:
        self.status = r.status
        self._body = r.body if isinstance(r.body, bytes) else b""

    async def __aenter__(self) -> _Resp:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self, limit: int | None = None) -> bytes:
        return self._body


class LoopbackTransport:
    """Delivers the controller's signed requests to each node's real PeerApi."""

    def __init__(self, key: NodeKey, apis: dict[str, PeerApi]) -> None:
        self.key = key
        self.apis = apis
        self.clock = SystemClock()

    async def request(self, peer: str, method: str, path: str, headers: Any, body: bytes,
                      **_: Any) -> _Resp:
        stream = BodyStream(ack=lambda _n: None, on_abort=lambda: None)
        stream.push((body, len(body)))
        stream.push(None)
        return _Resp(await self.apis[peer].handle(
            PeerRequest(self.key.peer_id, method, path, tuple(headers), stream)))


async def test_the_loop_flips_over_the_peer_protocol_and_publishes_the_plan(
        plan: PDPlan) -> None:
    ctl_key, intruder = NodeKey.generate(), NodeKey.generate()
    roles = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode"}
    nodes = {s: FakeNode(s, ModelRole(r), (ctl_key.peer_id,)) for s, r in roles.items()}

    keys = {s: NodeKey.generate() for s in nodes}  # (control requests are signed for one)

    def api(node: FakeNode, key: NodeKey) -> PeerApi:
        async def assign(peer: str, body: bytes) -> HandlerResponse:
            return HandlerResponse(403, (), b"")
        return PeerApi(_dataplane(key), assign, None,
                       lambda peer, body: flip_role(node, peer, body))  # type: ignore[arg-type]

    apis = {keys[s].peer_id: api(n, keys[s]) for s, n in nodes.items()}
    records = {s: node_record(s, r) for s, r in roles.items()}
    binding = bind_sessions(plan, records.values(), MODEL)
    assert binding.gpus == {"p1": (0,), "p2": (1,), "d1": (2,), "d2": (3,)}

    published: list[bytes] = []
    clock = FakeClock()
    executor = PeerPDExecutor(LoopbackTransport(ctl_key, apis), lambda s: keys[s].peer_id,
                              MODEL, published.append, wall=clock.now)
    await executor.apply(current_routing(plan, binding))
    first = decode_plan(published[-1])
    assert first.table.prefill == ("p1", "p2") and first.table.decode == ("d1", "d2")

    # an ingress trusting this controller installs the published plan; one trusting another
    # controller does not
    version = [0]

    def controller_record() -> list[NodeRecord]:
        rec = make_record("ctl")
        rec = dataclasses.replace(rec, peer_id=ctl_key.peer_id, meta=dataclasses.replace(
            rec.meta, pd_plan=published[-1]))
        return [rec]

    feed = PlanFeed(controller_record, lambda: version[0], [ctl_key.peer_id])
    assert feed({MODEL}) == first.table
    assert PlanFeed(controller_record, lambda: 0, [intruder.peer_id])({MODEL}) is None

    live = dict(records)
    ctl = PDController(plan, binding, lambda: [(r, False) for r in live.values()],
                       lambda: None, executor, clock,
                       PDControllerConfig(interval_s=10.0))
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await clock.advance(25.0)
    assert len(executor.applied) == 1  # only the initial routing
    del live["d1"]  # the decode node vanishes at t=25
    await clock.run_until(lambda: len(executor.applied) > 1, within=20.0, step=1.0)
    flips = [d for d in executor.applied if isinstance(d, SetRole)]
    assert [(d.session_ids, d.role) for d in flips] == [(("p2",), "decode")]
    assert nodes["p2"].role is ModelRole.DECODE and nodes["p1"].role is ModelRole.PREFILL
    assert [m.role for m in nodes["p2"].agent.record.meta.models] == [ModelRole.DECODE]
    assert executor.failures == []
    assert isinstance(executor.applied[-1], SetRouting)
    second = decode_plan(published[-1])
    assert second.issued_at > first.issued_at and second.table.plan_id != first.table.plan_id
    assert second.table.prefill == ("p1",) and set(second.table.decode) == {"d2", "p2"}
    version[0] += 1
    assert feed({MODEL}) == second.table  # newest wins
    stop.set()
    await clock.advance(20.0)
    await asyncio.wait_for(task, 5)


async def test_a_node_refuses_a_flip_signed_by_another_controller(plan: PDPlan) -> None:
    ctl_key, intruder = NodeKey.generate(), NodeKey.generate()
    node = FakeNode("p1", ModelRole.PREFILL, (ctl_key.peer_id,))

    async def assign(peer: str, body: bytes) -> HandlerResponse:
        return HandlerResponse(403, (), b"")

    api = PeerApi(_dataplane(), assign, None,
                  lambda peer, body: flip_role(node, peer, body))  # type: ignore[arg-type]
    executor = PeerPDExecutor(LoopbackTransport(intruder, {NODE.peer_id: api}),
                              lambda s: NODE.peer_id if s == "p1" else None, MODEL,
                              lambda _b: None)
    await executor.apply(SetRole(("p1",), "decode"))
    assert node.role is ModelRole.PREFILL
    assert executor.results[0][1] == 403 and "not_a_controller" in executor.results[0][2]
    await executor.apply(SetRole(("gone",), "decode"))  # not in the registry: logged
    assert len(executor.failures) == 2


def test_controller_cli_checks_its_pd_options(tmp_path: Any, plan: PDPlan) -> None:
    import json

    from click.testing import CliRunner

    from llmfabric.cli.controller import command

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    runner = CliRunner()
    got = runner.invoke(command, ["--pd-plan", str(path)])
    assert got.exit_code == 2 and "--pd-plan needs --bootstrap" in got.output
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("instances:\n  - {gpu: A40, count: 2, host: h0}\n")
    # without the links: the controller's own flags (the loader named plan pd's --links)
    got = runner.invoke(command, ["--pd-plan", str(path), "--pd-cluster", str(cluster),
                                  "--bootstrap", "127.0.0.1:1"])
    assert got.exit_code == 2 and "--pd-cluster with --pd-links, or --pd-topology" in got.output
    links = tmp_path / "links.csv"
    links.write_text("src,dst,gbps\n0,1,100\n")
    inputs = ["--pd-cluster", str(cluster), "--pd-links", str(links)]
    got = runner.invoke(command, ["--pd-plan", str(path), *inputs,
                                  "--bootstrap", "127.0.0.1:1"])
    assert got.exit_code == 1 and str(path) in got.output  # the plan needs 4 GPUs
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    got = runner.invoke(command, ["--pd-plan", str(bad), *inputs,
                                  "--bootstrap", "127.0.0.1:1"])
    assert got.exit_code == 1 and "bad.json" in got.output
