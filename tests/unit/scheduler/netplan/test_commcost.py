"""Exact costs on small graphs, computed by hand (bytes / (bytes/s) + latencies)."""

from __future__ import annotations

import pytest

from llmfabric.scheduler.netplan.commcost import (
    StageGPUs,
    choose_scheme,
    group_allreduce,
    ina_breakdown,
    t_ina,
    t_kv,
    t_pp,
    t_ring,
)
from llmfabric.scheduler.netplan.paths import all_pairs
from llmfabric.sim.collectives import ina_model, ring_over_path
from llmfabric.sim.errors import SpecError
from llmfabric.sim.models import get_model
from llmfabric.sim.topology import Topology

pytestmark = pytest.mark.unit

E = 12.5e9  # 100 Gbit/s in bytes/s
MB = 1e6


def star(slots: int = 1) -> Topology:
    """g0..g2 on switch s at 100 Gbps / 1 us; g3 at 50 Gbps / 2 us."""
    t = Topology()
    t.add_switch("s", slots)
    for g in ("g0", "g1", "g2", "g3"):
        t.add_gpu(g, "A100-40GB", g)
    for g in ("g0", "g1", "g2"):
        t.add_edge(g, "s", "ethernet", bytes_per_s=E, latency_s=1e-6)
    t.add_edge("g3", "s", "ethernet", bytes_per_s=E / 2, latency_s=2e-6)
    return t


def test_ina_paper_form_and_with_latency() -> None:
    t = star()
    group = ["g0", "g1", "g2", "g3"]
    # slowest member g3: 1 MB / 6.25 GB/s = 160 us up, 160 us down, + 1 us aggregation
    assert t_ina(t, group, "s", MB, hop_latency=0) == pytest.approx(321e-6, rel=1e-12)
    b = ina_breakdown(t, group, "s", MB)
    assert b.collect_s == pytest.approx(162e-6, rel=1e-12)
    assert b.distribute_s == pytest.approx(162e-6, rel=1e-12)
    assert b.total_s == pytest.approx(325e-6, rel=1e-12)
    # a per-hop latency parameter replaces the edges' own
    assert t_ina(t, group, "s", MB, hop_latency=5e-6) == pytest.approx(331e-6, rel=1e-12)


def test_ring_over_star() -> None:
    t = star()
    group = ["g3", "g1", "g0", "g2"]  # order does not matter: the ring is g0 g1 g2 g3
    # bottleneck 6.25 GB/s (g3's link), slowest hop latency 3 us (g2 -> s -> g3)
    assert t_ring(t, group, MB, hop_latency=0) == pytest.approx(6 * 0.25e6 / (E / 2))
    assert t_ring(t, group, MB) == pytest.approx(6 * 3e-6 + 240e-6, rel=1e-12)
    assert t_ring(t, ["g0"], MB) == 0.0


def test_choose_scheme_and_slots() -> None:
    t = star(slots=1)
    c = choose_scheme(t, ["g0", "g1", "g2", "g3"], MB)
    assert (c.scheme, c.switch) == ("ring", "s")
    assert c.t_ina == pytest.approx(325e-6) and c.t_ring == pytest.approx(258e-6)
    # in the paper's form a full-message INA (2 D / B) never beats the ring's
    # 2 (P-1)/P D / B on equal links; small (decode) messages are latency-bound, where
    # INA's 2 path latencies beat the ring's 2 (P-1) steps: 1 kB over the 4 GPUs
    small = choose_scheme(t, ["g0", "g1", "g2", "g3"], 1e3)
    assert small.scheme == "ina"
    assert small.t_ina == pytest.approx(2 * (2e-6 + 1e3 / (E / 2)) + 1e-6)
    assert small.t_ring == pytest.approx(6 * 3e-6 + 6 * 250 / (E / 2))
    c2 = choose_scheme(t, ["g0", "g1"], MB)
    assert c2.scheme == "ring" and c2.t_ina == pytest.approx(163e-6)
    assert c2.t_ring == pytest.approx(2 * 2e-6 + 80e-6)
    none = choose_scheme(t, ["g0", "g1"], 1e3, free_slots={"s": 0})
    assert (none.scheme, none.switch) == ("ring", None)
    assert choose_scheme(star(slots=0), ["g0", "g1"], 1e3).scheme == "ring"
    assert choose_scheme(star(slots=1), ["g0", "g1"], 1e3).scheme == "ina"


def fig2() -> Topology:
    """HeroServe Fig. 2: GPU a on access switch A, GPU b on B, A and B under core C; a's
    server mate m sits on B and is joined to a by NVLink (300 GB/s)."""
    t = Topology()
    for s in ("A", "B", "C"):
        t.add_switch(s, 4)
    t.add_gpu("a", "A100-40GB", "h0")
    t.add_gpu("m", "A100-40GB", "h0")
    t.add_gpu("b", "A100-40GB", "h1")
    t.add_edge("a", "A", "ethernet", bytes_per_s=E)
    t.add_edge("m", "B", "ethernet", bytes_per_s=E)
    t.add_edge("b", "B", "ethernet", bytes_per_s=E)
    t.add_edge("A", "C", "ethernet", bytes_per_s=E)
    t.add_edge("B", "C", "ethernet", bytes_per_s=E)
    t.add_edge("a", "m", "nvlink", bytes_per_s=300e9)
    return t


def test_fig2_nvlink_forwarding_beats_two_ethernet_hops() -> None:
    t = fig2()
    # INA at core C for {a, b}: 2 Ethernet hops each way = 160 us up
    assert ina_breakdown(t, ["a", "b"], "C", MB, hop_latency=0).collect_s == pytest.approx(
        160e-6)
    # INA at B: a forwards over NVLink to m, then one hop: 1 MB / 300 GB/s + 80 us
    assert ina_breakdown(t, ["a", "b"], "B", MB, hop_latency=0).collect_s == pytest.approx(
        MB / 300e9 + 80e-6)


def test_members_sharing_a_nic_split_it() -> None:
    t = Topology()
    t.add_switch("s", 1)
    t.add_gpu("g0", "A100-40GB", "h")
    t.add_gpu("g1", "A100-40GB", "h")
    t.add_edge("g0", "s", "ethernet", bytes_per_s=E)
    t.add_edge("g0", "g1", "nvlink", bytes_per_s=300e9)
    b = ina_breakdown(t, ["g0", "g1"], "s", MB, hop_latency=0)
    assert b.collect_s == pytest.approx(MB / 300e9 + 2 * MB / E)


def test_t_pp_min_over_senders_max_over_receivers() -> None:
    t = star()
    # from g0: to g1 160 us, to g3 80 + 160 = 240 us -> 240; from g1 the same
    assert t_pp(t, ["g0", "g1"], ["g2", "g3"], MB, hop_latency=0) == pytest.approx(240e-6)
    assert t_pp(t, ["g3"], ["g0"], MB, hop_latency=0) == pytest.approx(240e-6)


def test_t_kv_per_sender_serialised_slowest_decides() -> None:
    t = star()
    model = get_model("llama-3.1-8b")  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B
    n = 1000
    total = 32 * 8 * 128 * 2 * 2 * n
    pre = [StageGPUs(("g0", "g1"), (0, 32))]
    dec = [StageGPUs(("g2",), (0, 16)), StageGPUs(("g3",), (16, 32))]
    # g0 holds heads 0-3 of all layers: a quarter of the KV to g2 and a quarter to g3
    q = total / 4
    expect = q / E * 2 + (q / E + q / (E / 2))
    assert t_kv(t, model, pre, dec, n, hop_latency=0) == pytest.approx(expect, rel=1e-12)


def test_allreduce_models_match_the_costs() -> None:
    t = star()
    for group in (["g0", "g1"], ["g0", "g1", "g2", "g3"]):
        ina = group_allreduce(t, group, "ina", "s")
        assert ina.time(MB, len(group)) == pytest.approx(t_ina(t, group, "s", MB))
        ring = group_allreduce(t, group, "ring", None)
        assert ring.time(MB, len(group)) == pytest.approx(t_ring(t, group, MB))
    assert ring_over_path(E, 0.0).time(MB, 4) == pytest.approx(6 * 0.25e6 / E)


def test_ina_model_validation() -> None:
    with pytest.raises(SpecError):
        ina_model([], [])
    with pytest.raises(SpecError):
        ring_over_path(0.0, 0.0)
    with pytest.raises(SpecError):
        t_ina(star(), ["g0", "g0"], "s", MB)


def test_all_pairs_matrix() -> None:
    d, p = all_pairs(star(), MB, hop_latency=0)
    assert d[0, 1] == pytest.approx(160e-6)
    assert d[0, 3] == pytest.approx(240e-6)
    assert p[("g0", "g3")].nodes == ("g0", "s", "g3")
    d2, _ = all_pairs(fig2(), MB, kinds={"ethernet"}, hop_latency=0)
    assert d2[0, 1] == pytest.approx(4 * 80e-6)  # a -> A -> C -> B -> m, no NVLink


def test_hybrid_model_is_the_cheaper_scheme_per_message() -> None:
    from llmfabric.scheduler.netplan.planner import hybrid_model

    t = star()
    group = ["g0", "g1", "g2", "g3"]
    ina = group_allreduce(t, group, "ina", "s")
    ring = group_allreduce(t, group, "ring", None)
    hybrid = hybrid_model(ina, ring, 4)
    assert hybrid is not None
    for nbytes in (1e2, 1e3, 1e4, 1e5, 1e6, 1e7):
        assert hybrid.time(nbytes, 4) == pytest.approx(
            min(ina.time(nbytes, 4), ring.time(nbytes, 4)))
    assert hybrid_model(ina, ring, 3) is None  # not a size the custom slot serves


def test_choose_scheme_prefers_the_switch_where_ina_is_fastest() -> None:
    # fig2: a's NIC is on A, b's and m's on B; INA at B lets a forward over NVLink
    c = choose_scheme(fig2(), ["a", "b"], 1e3)
    assert c.switch in {"A", "B", "C"}
    t_by_switch = {s: t_ina(fig2(), ["a", "b"], s, 1e3) for s in ("A", "B", "C")}
    assert c.t_ina == pytest.approx(min(t_by_switch.values()))
    assert c.t_ina == pytest.approx(t_by_switch[c.switch])
    assert t_by_switch["B"] < t_by_switch["C"]  # NVLink + 1 hop beats 2 hops each way


def two_hosts() -> Topology:
    """a0, a1 on host A (NVLink 300 GB/s, 2 us), b0 on host B; each GPU's NIC on switch s
    at 100 Gbps / 1 us."""
    t = Topology()
    t.add_switch("s", 1)
    for g, h in (("a0", "A"), ("a1", "A"), ("b0", "B")):
        t.add_gpu(g, "A100-40GB", h)
        t.add_edge(g, "s", "ethernet", bytes_per_s=E, latency_s=1e-6)
    t.add_edge("a0", "a1", "nvlink", bytes_per_s=300e9, latency_s=2e-6)
    return t


def test_net_collective_cost_joins_collectives_through_the_nics() -> None:
    t = two_hosts()
    net = 30e-6
    # ring a0 -> a1 -> b0 -> a0: bottleneck 12.5 GB/s, slowest hop 2 us (NVLink a0-a1 and
    # the two-hop routes through s both 2 us); + net once, as the members span two hosts
    base = 4 * 2e-6 + 4 * (MB / 3) / E
    assert t_ring(t, ["a0", "a1", "b0"], MB) == pytest.approx(base, rel=1e-12)
    assert t_ring(t, ["a0", "a1", "b0"], MB, net_s=net) == pytest.approx(base + net,
                                                                          rel=1e-12)
    # inside one host the ring never reaches a NIC: no net cost
    inside = 2 * 2e-6 + 2 * (MB / 2) / 300e9
    assert t_ring(t, ["a0", "a1"], MB, net_s=net) == pytest.approx(inside, rel=1e-12)
    # INA always goes through the NICs: collect 1 us + 80 us, 1 us aggregation, distribute
    b = ina_breakdown(t, ["a0", "b0"], "s", MB, net_s=net)
    assert (b.collect_s, b.agg_s, b.net_s) == pytest.approx((81e-6, 1e-6, net))
    assert b.total_s == pytest.approx(163e-6 + net, rel=1e-12)
    assert t_ina(t, ["a0", "b0"], "s", MB, net_s=net) == pytest.approx(163e-6 + net)
    # the models the simulator runs carry the same cost
    for scheme, sw, expect in (("ring", None, base + net), ("ina", "s", None)):
        m = group_allreduce(t, ["a0", "a1", "b0"], scheme, sw, net_s=net)  # type: ignore[arg-type]
        want = expect if expect is not None else t_ina(t, ["a0", "a1", "b0"], "s", MB,
                                                       net_s=net)
        assert m.time(MB, 3) == pytest.approx(want, rel=1e-9)
    m_in = group_allreduce(t, ["a0", "a1"], "ring", None, net_s=net)
    assert m_in.time(MB, 2) == pytest.approx(inside, rel=1e-9)
    # a cost both schemes pay never flips the choice
    for nbytes in (1e3, MB, 64 * MB):
        c0 = choose_scheme(t, ["a0", "a1", "b0"], nbytes)
        c1 = choose_scheme(t, ["a0", "a1", "b0"], nbytes, net_s=net)
        assert (c0.scheme, c0.switch) == (c1.scheme, c1.switch)
        assert c1.t_ring == pytest.approx(c0.t_ring + net, rel=1e-12)
        assert c1.t_ina == pytest.approx(c0.t_ina + net, rel=1e-12)
    for bad in (-1e-6, float("inf"), float("nan")):
        with pytest.raises(SpecError):
            t_ring(t, ["a0", "b0"], MB, net_s=bad)
        with pytest.raises(SpecError):
            group_allreduce(t, ["a0", "b0"], "ina", "s", net_s=bad)
