"""H respects link capacity: the steady-state bytes a plan pushes over each link
(linkload.py), hand-computed on tiny topologies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.scheduler.netplan.baselines import atp_comm, distserve
from llmfabric.scheduler.netplan.commcost import StageGPUs
from llmfabric.scheduler.netplan.linkload import (
    KvQueue,
    LinkLoad,
    ina_load,
    kv_load,
    link_rate,
    ring_load,
)
from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.planner import plan
from llmfabric.scheduler.netplan.problem import LINK_UTIL, NetProblem, NetWorkload
from llmfabric.sim.errors import SpecError
from llmfabric.sim.models import get_model
from llmfabric.sim.parallel import kv_transfer_bytes
from llmfabric.sim.topology import Topology

pytestmark = pytest.mark.unit

MODEL = "llama-3.1-8b"
K_IN, K_OUT = 512, 16


def two_gpus(gbps: float) -> Topology:
    """A prefill GPU and a decode GPU on two hosts, joined by one Ethernet link."""
    topo = Topology()
    topo.add_gpu("gpu0", "A100-80GB", "h0")
    topo.add_gpu("gpu1", "A100-80GB", "h1")
    topo.add_edge("gpu0", "gpu1", "ethernet", gbps=gbps)
    return topo


def problem(gbps: float = 10.0, rate: float = 1.0, **kw: object) -> NetProblem:
    # SLAs loose enough that only prefill load or the link can bind
    return NetProblem.of(
        two_gpus(gbps),
        MODEL,
        ["gpu0"],
        ["gpu1"],
        NetWorkload(rate, K_IN, K_OUT),
        100.0,
        100.0,
        **kw,
    )


def kv_bytes() -> float:
    return kv_transfer_bytes(get_model(MODEL), K_IN)


def test_the_link_caps_h_at_capacity_times_util_over_kv_bytes() -> None:
    cap = 10e9 / 8  # 10 Gbit/s in bytes/s
    kv = kv_bytes()  # 2 x 32 layers x 1024 kv_dim x 2 B x 512 tokens = 64 MiB
    assert kv == pytest.approx(2 * 32 * 1024 * 2 * 512)
    p = plan(problem())
    assert p.p_all == (1, 1, 1, 1)  # no all-reduce, no pipeline: only the KV crosses it
    assert pytest.approx(LINK_UTIL * cap / kv) == p.H  # 0.9 x 1.25e9 / 67.1e6 = 16.8 req/s
    assert p.binding == "link:gpu0->gpu1"
    assert p.link_edge_h == "gpu0->gpu1" and p.link_util_h == pytest.approx(LINK_UTIL)
    # without the link bound the prefill GPU alone would sustain more: the link binds
    assert 1 / p.T_pre > p.H
    assert pytest.approx(p.H) == distserve(problem()).H


def test_the_cap_scales_h_and_a_fat_link_leaves_the_other_bounds() -> None:
    half = plan(problem(link_util=0.45)).H
    assert half == pytest.approx(plan(problem()).H / 2)
    fat = plan(problem(gbps=1e5))  # 100 Tbit/s: the prefill queue binds (rho -> 1)
    assert fat.binding == "ttft"  # the 100 s TTFT, M/D/1 just below rho = 1
    assert pytest.approx(1 / fat.T_pre, rel=1e-3) == fat.H
    assert fat.link_util_h < 0.05
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(SpecError, match="link_util"):
            problem(link_util=bad)


def test_kv_waits_behind_other_requests_as_an_m_d_1_queue() -> None:
    cap, kv = 10e9 / 8, kv_bytes()
    rate = 10.0  # rho = 10 x 67.1e6 / 1.25e9 = 0.537
    p = plan(problem(rate=rate))
    s = kv / cap  # one request's hand-off holds the link for 53.7 ms
    rho = rate * s
    assert p.T_f == pytest.approx(s)  # the hand-off alone: bytes / capacity
    assert p.T_f_wait == pytest.approx(rho * s / (2 * (1 - rho)))  # 31.1 ms
    assert p.T_dec == pytest.approx(p.T_c_dec + p.T_f + p.T_f_wait)  # no step network
    # a TPOT budget that the hand-off meets alone but not behind the queue binds before
    # the link: step + T_f + wait(H) = SLA
    slow = NetProblem.of(
        two_gpus(10.0), MODEL, ["gpu0"], ["gpu1"], NetWorkload(rate, K_IN, K_OUT), 100.0, p.T_dec
    )
    q = plan(slow)
    assert q.binding == "tpot"
    assert pytest.approx(rate, rel=1e-3) == q.H
    assert q.H < plan(problem()).H


def test_ring_and_ina_bytes_per_edge_on_a_star() -> None:
    topo = Topology()
    topo.add_switch("sw", 8)
    group = [f"gpu{k}" for k in range(4)]
    for g in group:
        topo.add_gpu(g, "A100-80GB", f"h{g}")
        topo.add_edge(g, "sw", "ethernet", gbps=100)
    routes = Routes(topo)
    ring = ring_load(topo, group, routes)
    # each member sends 2 (P - 1) / P = 1.5 bytes per byte to the next, through the switch
    assert ring.bytes == {**{(g, "sw"): 1.5 for g in group}, **{("sw", g): 1.5 for g in group}}
    assert set(ring.capacity.values()) == {100e9 / 8}
    ina = ina_load(group, "sw", routes)
    assert ina.bytes == {**{(g, "sw"): 1.0 for g in group}, **{("sw", g): 1.0 for g in group}}
    assert ring_load(topo, group[:1], routes).bytes == {}


def test_link_rate_and_queue_by_hand() -> None:
    ld = LinkLoad()
    ld.bytes, ld.capacity = (
        {("a", "b"): 100.0, ("b", "c"): 300.0},
        {("a", "b"): 1000.0, ("b", "c"): 1000.0},
    )
    bound = link_rate(ld, 0.9)
    assert bound.rate == pytest.approx(3.0) and bound.name == "link:b->c"
    with pytest.raises(SpecError):
        link_rate(ld, 0.0)
    topo = two_gpus(8e-9 * 1000.0)  # 1000 bytes/s
    kv = kv_load(get_model(MODEL), [[_stage("gpu0")]], [[_stage("gpu1")]], 1.0, Routes(topo))
    b = kv_transfer_bytes(get_model(MODEL), 1.0)
    assert kv.mean.bytes == {("gpu0", "gpu1"): pytest.approx(b)}
    queue = KvQueue(kv.mean, kv)
    s = b / 1000.0
    lam = 0.5 / s
    assert queue.wait(lam) == pytest.approx(0.5 * s / (2 * 0.5))
    assert queue.wait(1.01 / s) == float("inf")  # beyond the link's capacity


def _stage(gpu: str) -> StageGPUs:
    return StageGPUs((gpu,), (0, get_model(MODEL).n_layers))


def test_atp_fallback_crosses_the_uplink_twice_more_each_way() -> None:
    topo = Topology()
    topo.add_switch("acc", 8)
    topo.add_switch("core", 8)
    topo.add_edge("acc", "core", "ethernet", gbps=10)
    for k in range(3):
        topo.add_gpu(f"gpu{k}", "A100-80GB", f"h{k}")
        topo.add_edge(f"gpu{k}", "acc", "ethernet", gbps=100)
    p = NetProblem.of(topo, MODEL, ["gpu0", "gpu1"], ["gpu2"], NetWorkload(1.0, 8, 8), 1.0, 1.0)
    routes = Routes(topo)
    group = ["gpu0", "gpu1"]
    slot = atp_comm(p, group, 1e6, {"acc": 1}, routes)
    assert slot.fallback == 0.0 and slot.load.bytes == ina_load(group, "acc", routes).bytes
    assert ("acc", "core") not in slot.load.bytes
    full = atp_comm(p, group, 1e6, {"acc": 0}, routes)
    assert full.fallback == 1.0
    # two members, each twice more over the uplink in each direction
    assert full.load.bytes[("acc", "core")] == pytest.approx(4.0)
    assert full.load.bytes[("core", "acc")] == pytest.approx(4.0)
    assert full.load.capacity[("acc", "core")] == pytest.approx(10e9 / 8)


@settings(max_examples=15, deadline=None)
@given(
    gbps=st.floats(0.5, 400.0),
    util=st.floats(0.1, 1.0),
    rate=st.floats(0.1, 50.0),
)
def test_no_link_is_loaded_past_its_cap_at_h(gbps: float, util: float, rate: float) -> None:
    p = plan(problem(gbps=gbps, rate=rate, link_util=util))
    bound = util * gbps * 1e9 / 8 / kv_bytes()
    assert p.H / bound <= 1 + 1e-9
    assert p.link_util_h <= util * (1 + 1e-9)
    assert p.binding.startswith("link:") == (abs(p.H / bound - 1) < 1e-12)
    # a fatter link never lowers H
    assert plan(problem(gbps=2 * gbps, rate=rate, link_util=util)).H >= p.H * (1 - 1e-9)
