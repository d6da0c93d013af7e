"""HeroServe's INA member routes: NVLink forwarding to the least-loaded NIC (spread.py).

Hand-computed on servers of 4 GPUs, NVLink all-to-all (300 GB/s, 2 us), GPU k's 100G NIC
(12.5 GB/s, 1 us) on access switch k mod 2, the two access switches joined through a core
over 10 Gbit/s links. Dijkstra routes each member alone: members on sw1 reach sw0 through the
lowest-id mate (g0), so g0's NIC carries 3 members; spread: 2 per NIC.
"""

from __future__ import annotations

import pytest

from llmfabric.scheduler.netplan.baselines import ETHERNET
from llmfabric.scheduler.netplan.commcost import choose_scheme, ina_breakdown, ina_routes, t_ring
from llmfabric.scheduler.netplan.linkload import ina_load
from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.spread import down_routes, spread_routes
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import Topology

NIC = 12.5e9  # bytes/s
NVL = 300e9


def servers(n: int) -> Topology:
    t = Topology()
    for s in ("sw0", "sw1", "core"):
        t.add_switch(s, 8)
    for s in ("sw0", "sw1"):
        t.add_edge(s, "core", "ethernet", gbps=10, latency_s=1e-6)
    for h in range(n):
        ids = [f"s{h}g{k}" for k in range(4)]
        for k, g in enumerate(ids):
            t.add_gpu(g, "A100-80GB", f"h{h}")
            t.add_edge(g, f"sw{k % 2}", "ethernet", gbps=100, latency_s=1e-6)
        for a in range(4):
            for b in range(a + 1, 4):
                t.add_edge(ids[a], ids[b], "nvlink", gbs=300, latency_s=2e-6)
    return t


def test_dijkstra_piles_members_on_one_nic_spread_balances() -> None:
    t = servers(1)
    r = Routes(t)
    group = ["s0g0", "s0g1", "s0g2", "s0g3"]
    alone, _ = ina_routes(t, group, "sw0", r)
    assert [p.nodes for p in alone] == [
        ("s0g0", "sw0"),
        ("s0g1", "s0g0", "sw0"),
        ("s0g2", "sw0"),
        ("s0g3", "s0g0", "sw0"),
    ]
    up = spread_routes(t, group, "sw0", r)
    # g0, g2 (own NIC on sw0) pick first; g1 then ties at 2 per NIC and keeps its own
    # route (via g0); g3 finds g0's NIC at 2 and g2's at 1: via g2
    assert [p.nodes for p in up] == [
        ("s0g0", "sw0"),
        ("s0g1", "s0g0", "sw0"),
        ("s0g2", "sw0"),
        ("s0g3", "s0g2", "sw0"),
    ]
    assert [p.nodes for p in down_routes(up)] == [tuple(reversed(p.nodes)) for p in up]


def test_collect_time_hand_computed() -> None:
    t = servers(1)
    group = ["s0g0", "s0g1", "s0g2", "s0g3"]
    d = 1e6
    lat = 2e-6 + 1e-6  # NVLink hop + NIC hop
    dij = ina_breakdown(t, group, "sw0", d)
    spread = ina_breakdown(t, group, "sw0", d, spread=True)
    # slowest member: g1 / g3 forward over NVLink then share the NIC with 2 others (3) or 1 (2)
    assert dij.collect_s == pytest.approx(d * (3 / NIC + 1 / NVL) + lat, rel=1e-12)  # 246.3 us
    assert spread.collect_s == pytest.approx(d * (2 / NIC + 1 / NVL) + lat, rel=1e-12)  # 166.3
    assert spread.distribute_s == pytest.approx(spread.collect_s, rel=1e-12)
    assert spread.total_s == pytest.approx(2 * spread.collect_s + 1e-6, rel=1e-12)


def test_ethernet_only_routes_are_not_spread() -> None:
    """The baselines forward over Ethernet only: no NVLink detour, so nothing to spread."""
    t = servers(1)
    eth = Routes(t, 1 << 20, ETHERNET)
    group = ["s0g0", "s0g1", "s0g2", "s0g3"]
    up = spread_routes(t, group, "sw0", eth)
    assert [p.nodes for p in up] == [eth.route(g, "sw0").nodes for g in group]
    assert up[1].nodes == ("s0g1", "sw1", "core", "sw0")


def test_link_load_follows_the_spread_routes() -> None:
    t = servers(1)
    r = Routes(t)
    group = ["s0g0", "s0g1", "s0g2", "s0g3"]
    dij = ina_load(group, "sw0", r).bytes
    spread = ina_load(group, "sw0", r, spread=True).bytes
    assert dij[("s0g0", "sw0")] == 3 and dij[("s0g2", "sw0")] == 1
    assert spread[("s0g0", "sw0")] == 2 and spread[("s0g2", "sw0")] == 2
    assert spread[("sw0", "s0g2")] == 2 and spread[("s0g2", "s0g3")] == 1
    assert sum(spread.values()) == pytest.approx(sum(dij.values()))


def test_spread_turns_the_scheme_choice() -> None:
    """8 GPUs over two servers, 200 KB per member (in units of 1 / 12.5 GB/s = 80 ps a
    byte): ring 2 x 7 x (D / 8) over one NIC + 14 steps of 4 us = 84 us; INA at sw0 with
    Dijkstra routes (3 per NIC) 2 (3 D / NIC + D / NVL + 3 us) + 1 us = 104.3 us; spread
    (2 per NIC) 72.3 us: the choice turns from ring to INA."""
    t = servers(2)
    r = Routes(t)
    group = [f"s{h}g{k}" for h in range(2) for k in range(4)]
    d = 200e3
    ring = t_ring(t, group, d, routes=r)
    assert ring == pytest.approx(14 * d / 8 / NIC + 14 * 4e-6, rel=1e-12)
    before = choose_scheme(t, group, d, routes=r)
    after = choose_scheme(t, group, d, routes=r, spread=True)
    assert before.t_ina == pytest.approx(2 * (d * (3 / NIC + 1 / NVL) + 3e-6) + 1e-6, rel=1e-12)
    assert after.t_ina == pytest.approx(2 * (d * (2 / NIC + 1 / NVL) + 3e-6) + 1e-6, rel=1e-12)
    assert (before.scheme, after.scheme, after.switch) == ("ring", "ina", "sw0")


def test_hostile_inputs() -> None:
    t = servers(1)
    r = Routes(t)
    with pytest.raises(SpecError):
        spread_routes(t, [], "sw0", r)
    with pytest.raises(SpecError):
        spread_routes(t, ["s0g0", "s0g0"], "sw0", r)
    with pytest.raises(SpecError):
        spread_routes(servers(1), ["s0g0"], "sw0", r)  # routes of another topology
    with pytest.raises(SpecError):
        spread_routes(t, ["s0g0"], "nope", r)


def test_heroserve_prices_the_spread_distserve_does_not() -> None:
    """The strategies' per-group choice on test_spread_turns_the_scheme_choice's group (net
    cost 0): HeroServe's INA at sw0 with the spread routes (72.3 us) beats the ring (84 us);
    DistServe rings, DS-SwitchML's INA at the core is over Ethernet only."""
    from llmfabric.scheduler.netplan.baselines import distserve_comm
    from llmfabric.scheduler.netplan.planner import heroserve_comm
    from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
    from llmfabric.sim.models import get_model

    t = servers(2)
    group = [f"s{h}g{k}" for h in range(2) for k in range(4)]
    problem = NetProblem(
        t,
        get_model("opt-66b"),
        tuple(group[:4]),
        tuple(group[4:]),
        NetWorkload(1.0, 512, 64),
        10.0,
        1.0,
        net_collective_s=0.0,
    )
    r = Routes(t)
    d = 200e3
    hero = heroserve_comm(problem, group, d, {"sw0": 1, "sw1": 1, "core": 1}, r)
    assert (hero.scheme, hero.switch) == ("ina", "sw0")
    assert hero.t_ina == pytest.approx(2 * (d * (2 / NIC + 1 / NVL) + 3e-6) + 1e-6, rel=1e-12)
    assert hero.load.bytes[("s0g0", "sw0")] == 2 and hero.load.bytes[("s0g2", "sw0")] == 2
    dist = distserve_comm(problem, group, d, {"sw0": 1}, r)
    assert dist.scheme == "ring"
    assert dist.t_ring == pytest.approx(14 * d / 8 / NIC + 14 * 4e-6, rel=1e-12)
