"""The planner's topology from a fabric's measured links (scheduler/netplan/from_fabric.py):
links measured by the real prober on virtual time feed the planner, which then places the
tensor-parallel group on the fast pair; hostile views are refused or left out."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from llmfabric.net.linkprobe import LinkProber, LinkTable
from llmfabric.scheduler.netplan.from_fabric import build_topology, host_name, parse_assume_gpu
from llmfabric.scheduler.netplan.planner import plan
from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
from llmfabric.sim.errors import SpecError
from llmfabric.testing.fake_clock import FakeClock

PEERS = ["aaaaaaaa1", "bbbbbbbb2", "cccccccc3", "dddddddd4"]
FAST, SLOW = (0.0002, 12.5e9 / 8 * 8), (0.002, 125e6)  # 100 Gbit/s vs 1 Gbit/s


def _link(a: str, b: str) -> tuple[float, float]:
    return FAST if {a, b} == {PEERS[0], PEERS[1]} else SLOW


def _all_slow(a: str, b: str) -> tuple[float, float]:
    return SLOW


def _node(peer: str, gpus: int, gpu: str = "A100-80GB", state: str = "SERVING") -> dict[str, Any]:
    return {
        "peer_id": peer,
        "state": state,
        "hardware": {"gpu_model": gpu, "gpu_count": gpus, "interconnect": "pcie"},
    }


async def _measure(me: str, clock: FakeClock, link: Any) -> dict[str, Any]:
    async def probe(peer: str, n: int) -> None:  # the in-memory network of shaped links
        rtt, bw = link(me, peer)
        await clock.sleep(rtt + n / bw)

    table = LinkTable()
    prober = LinkProber(
        clock,
        probe,
        lambda: [p for p in PEERS if p != me],
        table,
        peers_per_round=8,
        rng=random.Random(0),
    )
    for _ in range(2):
        await prober.round()
    return {"peer": me, **table.to_json()}


async def _fabric_views(link: Any = _link) -> tuple[dict[str, Any], dict[str, Any]]:
    clock = FakeClock()
    tasks = [asyncio.ensure_future(_measure(p, clock, link)) for p in PEERS]
    await clock.advance(60)
    tables = [await t for t in tasks]
    nodes = {
        "nodes": [
            _node(PEERS[0], 2),
            _node(PEERS[1], 2),
            _node(PEERS[2], 2),
            _node(PEERS[3], 4, "H100-SXM"),
            {
                "peer_id": "eeeeeeee5",
                "state": "SERVING",
                "hardware": {"gpu_model": "cpu", "gpu_count": 0},
            },
        ]
    }
    return nodes, {"self": PEERS[0], "nodes": tables}


async def test_measured_links_become_the_topology_and_steer_the_plan() -> None:
    nodes, links = await _fabric_views()
    ft = build_topology(nodes, links)
    h = [host_name(p) for p in PEERS]
    assert set(ft.hosts) == set(h)
    assert ft.skipped == [f"{host_name('eeeeeeee5')}: no known GPU in its record"]
    fast = ft.links[tuple(sorted((h[0], h[1])))]  # type: ignore[index]
    slow = ft.links[tuple(sorted((h[0], h[2])))]  # type: ignore[index]
    assert fast.bytes_per_s == pytest.approx(FAST[1], rel=1e-6)
    assert slow.bytes_per_s == pytest.approx(SLOW[1], rel=1e-6)
    assert slow.rtt_s > fast.rtt_s
    # Llama-3-70B (140 GB) needs 4 x 80 GB: the prefill instance spans the two 2-GPU
    # nodes. The same fabric measured with every link slow plans a slower prefill.
    measured = _plan(ft.topology, h)
    nodes, links = await _fabric_views(_all_slow)
    slow_plan = _plan(build_topology(nodes, links).topology, h)
    assert measured.H > 0 and slow_plan.H > 0
    assert measured.T_pre < slow_plan.T_pre
    # Equal H when both bind on the same slow edge: the measured rates agree to ~1e-15
    # (float rounding of the probe's fit), hence the tolerance.
    assert measured.H >= slow_plan.H * (1 - 1e-9)


def _plan(topology: Any, h: list[str]) -> Any:
    problem = NetProblem.of(
        topology,
        "llama-3-70b",
        [f"{x}-*" for x in h[:2]],
        f"{h[3]}-*",
        NetWorkload(rate=0.5, mean_in=512, mean_out=128),
        10.0,
        1.0,
        max_candi=6,
    )
    return plan(problem)


def test_a_bad_or_missing_table_is_left_out_not_trusted() -> None:
    nodes = {"nodes": [_node(PEERS[0], 1), _node(PEERS[1], 1), _node(PEERS[2], 1)]}
    good = {"peer": PEERS[1], "rtt_s": 0.001, "bytes_per_s": 1e9, "samples": 1, "measured_at": 1.0}
    links = {
        "nodes": [
            {"peer": PEERS[0], "links": [good]},
            {"peer": PEERS[1], "links": [{**good, "peer": PEERS[2], "bytes_per_s": -5}]},
            {"peer": PEERS[2], "error": "unreachable"},
            {"peer": "stranger", "links": [good]},
            "junk",
        ]
    }
    ft = build_topology(nodes, links)
    assert list(ft.links) == [tuple(sorted((host_name(PEERS[0]), host_name(PEERS[1]))))]
    assert len(ft.skipped) == 2 and "invalid" in ft.skipped[0]


def test_cpu_nodes_plan_with_an_assumed_gpu_and_bad_views_are_refused() -> None:
    nodes = {
        "nodes": [
            {"peer_id": PEERS[0], "hardware": {"gpu_model": "cpu"}},
            {**_node(PEERS[1], 1), "state": "LEFT"},
        ]
    }
    ft = build_topology(nodes, {"nodes": []}, assume_gpu=parse_assume_gpu("a100-80gb:2"))
    assert ft.topology.gpus() == [f"{host_name(PEERS[0])}-g0", f"{host_name(PEERS[0])}-g1"]
    for bad in ("a100:0", "a100:x", ":2"):
        with pytest.raises(SpecError):
            parse_assume_gpu(bad)
    with pytest.raises(SpecError):
        build_topology({"nodes": "x"}, {"nodes": []})
    with pytest.raises(SpecError):
        build_topology({"nodes": []}, [])


def test_a_fabric_node_carries_no_transit_traffic() -> None:
    from llmfabric.scheduler.netplan.paths import Routes

    good = {"rtt_s": 0.001, "samples": 1, "measured_at": 1.0}
    a, b, c = PEERS[:3]
    nodes = {"nodes": [_node(a, 1), _node(b, 1), _node(c, 1)]}
    links = {
        "nodes": [
            {
                "peer": a,
                "links": [
                    {**good, "peer": b, "bytes_per_s": 1e6},
                    {**good, "peer": c, "bytes_per_s": 1e10},
                ],
            },
            {"peer": c, "links": [{**good, "peer": b, "bytes_per_s": 1e10}]},
        ]
    }
    topo = build_topology(nodes, links).topology
    ha, hb, hc = (host_name(p) for p in (a, b, c))
    route = Routes(topo, 1 << 20).route(f"{ha}-g0", f"{hb}-g0")
    # the slow direct link, not the 10 GB/s detour through node c (nodes do not forward)
    assert route.nodes == (f"{ha}-g0", ha, hb, f"{hb}-g0")
    assert hc not in Routes(topo, 1 << 20).route(f"{hb}-g0", f"{ha}-g0").nodes


def test_two_peers_never_share_a_host_name() -> None:
    """Host names were "n" + 8 characters of the peer id, 3 of them the "zQm" every id shares:
    a member could grind a key whose name shadowed another node's GPUs and links (nothing
    reported), and honest 5,000-node fleets collided by chance in 6%."""
    from llmfabric.identity import NodeKey

    ids = [NodeKey.generate().peer_id for _ in range(2000)]
    assert len({host_name(p) for p in ids}) == len(ids)
    assert all(len(host_name(p)) == 17 and not host_name(p).startswith("nzQm") for p in ids)


@pytest.mark.hostile
def test_a_link_both_sides_report_is_taken_at_its_worse_side() -> None:
    """Each side of a link reports it and may lie: a member claiming a 100 Gbit/s, 0.1 ms link
    to an honest peer that measured 1 Gbit/s and 4 ms gets the honest side's numbers (the
    slower throughput and the longer round trip); a pair only one side reported is taken as
    it says and named as such."""
    from llmfabric.scheduler.netplan.from_fabric import summary

    a, b, c = PEERS[:3]
    nodes = {"nodes": [_node(a, 1), _node(b, 1), _node(c, 1)]}
    est = {"samples": 3, "measured_at": 1.0}
    links = {"nodes": [
        {"peer": a, "links": [{**est, "peer": b, "rtt_s": 0.0001, "bytes_per_s": 12.5e9},
                              {**est, "peer": c, "rtt_s": 0.0002, "bytes_per_s": 12.5e9}]},
        {"peer": b, "links": [{**est, "peer": a, "rtt_s": 0.004, "bytes_per_s": 125e6}]},
    ]}
    ft = build_topology(nodes, links)
    ha, hb, hc = (host_name(p) for p in (a, b, c))
    ab, ac = tuple(sorted((ha, hb))), tuple(sorted((ha, hc)))
    assert (ft.links[ab].rtt_s, ft.links[ab].bytes_per_s) == (0.004, 125e6)
    assert ft.links[ab].samples == 6
    assert ft.one_sided == [ac]
    assert {(e["a"], e["b"]): e["sides"] for e in summary(ft)} == {ab: 2, ac: 1}
    edge = next(e for e in ft.topology.neighbours(ha) if e.other(ha) == hb)
    assert edge.latency_s == pytest.approx(0.002)
