"""Topology graph: hand-computed path costs on small graphs, generators, YAML round trip and
path laws (symmetry, triangle inequality, widest >= any path's bottleneck)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import SpecError
from llmfabric.sim.topology import Topology, cloud_instances, fat_tree_tracks


def _diamond() -> Topology:
    """a -s1- b: 10 GB/s 1 us then 5 GB/s 2 us; a -s2- b: 1 GB/s 0.1 us twice."""
    t = Topology()
    t.add_gpu("a", "A100-80GB", "h0")
    t.add_gpu("b", "A100-80GB", "h1")
    t.add_switch("s1")
    t.add_switch("s2")
    t.add_edge("a", "s1", "ethernet", gbs=10, latency_s=1e-6)
    t.add_edge("s1", "b", "ethernet", gbs=5, latency_s=2e-6)
    t.add_edge("a", "s2", "wan", bytes_per_s=1e9, latency_s=1e-7)
    t.add_edge("s2", "b", "wan", gbps=8, latency_s=1e-7)  # 8 Gbit/s = 1 GB/s
    return t


def test_shortest_path_depends_on_message_size() -> None:
    t = _diamond()
    small = t.path("a", "b", n_bytes=1.0)
    assert small.nodes == ("a", "s2", "b")  # 0.2 us + 2 ns beats 3 us
    assert small.latency_s == pytest.approx(2e-7)
    big = t.path("a", "b", n_bytes=1e6)
    assert big.nodes == ("a", "s1", "b")
    # store-and-forward cost: 3 us + 1e6/10e9 + 1e6/5e9 = 303 us (vs 2000.2 us the other way)
    assert big.time(1e6, store_and_forward=True) == pytest.approx(3e-6 + 1e-4 + 2e-4)
    assert big.time(1e6) == pytest.approx(3e-6 + 2e-4)  # cut-through: the bottleneck decides


def test_widest_path_and_pair_link() -> None:
    t = _diamond()
    wide = t.path("a", "b", widest=True)
    assert wide.nodes == ("a", "s1", "b") and wide.bottleneck == pytest.approx(5e9)
    link = t.pair_link("a", "b")  # 1 MiB: the s1 route
    assert link.latency_s == pytest.approx(3e-6) and link.bandwidth == pytest.approx(5e9)
    saf = t.pair_link("a", "b", store_and_forward=True)
    assert saf.bandwidth == pytest.approx(1 / (1 / 10e9 + 1 / 5e9))
    assert t.pair_link("b", "a") == link  # full duplex: symmetric
    bw = t.bandwidth_matrix()
    assert bw.shape == (2, 2) and math.isinf(bw[0, 0]) and bw[0, 1] == pytest.approx(5e9)
    lat = t.latency_matrix(n_bytes=1.0)
    assert lat[0, 1] == pytest.approx(2e-7) and lat[1, 1] == 0.0


def test_equal_bottleneck_widest_prefers_lower_latency() -> None:
    t = Topology()
    for g in ("x", "y"):
        t.add_gpu(g, "H100", g)
    t.add_switch("slow")
    t.add_switch("fast")
    t.add_edge("x", "slow", "ethernet", gbs=1, latency_s=1e-3)
    t.add_edge("slow", "y", "ethernet", gbs=1, latency_s=1e-3)
    t.add_edge("x", "fast", "ethernet", gbs=1, latency_s=1e-6)
    t.add_edge("fast", "y", "ethernet", gbs=1, latency_s=1e-6)
    assert t.path("x", "y", widest=True).nodes == ("x", "fast", "y")


def test_bad_inputs_are_rejected() -> None:
    t = _diamond()
    with pytest.raises(SpecError):
        t.add_gpu("a", "H100", "h")  # duplicate
    with pytest.raises(SpecError):
        t.add_edge("a", "zz", "ethernet", gbs=1)  # unknown endpoint
    with pytest.raises(SpecError):
        t.add_edge("a", "b", "carrier-pigeon", gbs=1)
    with pytest.raises(SpecError):
        t.add_edge("a", "b", "wan", gbs=1, gbps=8)  # capacity twice
    with pytest.raises(SpecError):
        t.add_edge("a", "b", "wan", gbs=0)
    with pytest.raises(SpecError):
        t.add_edge("a", "b", "wan", gbs=1, latency_s=-1)
    with pytest.raises(SpecError):
        t.pair_link("a", "a")
    t.add_gpu("island", "H100", "h9")
    with pytest.raises(SpecError, match="disconnected"):
        t.path("a", "island")
    assert t.bandwidth_matrix()[0, 2] == 0.0


def test_fat_tree_tracks_routes_over_nvlink_to_the_right_track() -> None:
    t = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, nic_gbps=100, nvlink_gbs=300,
                        gpu_types=["A100-40GB", "A100-40GB", "V100", "V100"])
    assert len(t.gpus()) == 16 and set(t.switches()) == {"access0", "access1", "core0"}
    assert t.gpu("gpu8").gpu_type.startswith("V100") and t.gpu("gpu8").host == "server2"
    # same track, other server: gpu0 -> access0 -> gpu4, 2 Ethernet hops at 12.5 GB/s
    r = t.path("gpu0", "gpu4", n_bytes=1e6)
    assert r.nodes == ("gpu0", "access0", "gpu4")
    assert r.latency_s == pytest.approx(2e-6) and r.bottleneck == pytest.approx(12.5e9)
    # other track: NVLink to gpu1 (track 1) then one access switch, not up through the core
    r = t.path("gpu0", "gpu5", n_bytes=1e6)
    assert r.nodes == ("gpu0", "gpu1", "access1", "gpu5")
    assert r.latency_s == pytest.approx(2e-6 + 2e-6)
    # same server: direct NVLink
    assert t.pair_link("gpu0", "gpu3").bandwidth == pytest.approx(300e9)


def test_cloud_instances_seeded_and_bounded() -> None:
    spec = [("RTX-A6000", 4), ("RTX-A5000", 4), ("A40", 8)]
    a = cloud_instances(spec, inter_gbps=(5, 40), seed=3)
    b = cloud_instances(spec, inter_gbps=(5, 40), seed=3)
    c = cloud_instances(spec, inter_gbps=(5, 40), seed=4)
    bw = a.bandwidth_matrix()
    assert np.array_equal(bw, b.bandwidth_matrix())
    assert not np.array_equal(bw, c.bandwidth_matrix())
    assert a.gpus() == list(range(16)) and a.gpu(4).host == "inst1"
    assert bw[0, 1] == pytest.approx(10e9)  # same instance: PCIe 10 GB/s
    assert a.pair_link(0, 1).latency_s == pytest.approx(10e-6)
    inter = bw[0, 4]
    assert 5e9 / 8 * 0.6 <= inter <= 40e9 / 8 * 0.6
    assert np.allclose(bw, bw.T)
    assert a.pair_link(0, 8).latency_s == pytest.approx(1e-3 + 10e-6)


def test_constructor_from_nodes_and_edges() -> None:
    t = _diamond()
    nodes = [t.gpu("a"), t.gpu("b"), t.switch("s1"), t.switch("s2")]
    u = Topology(nodes, t.edges)
    assert u.gpus() == ["a", "b"] and u.pair_link("a", "b") == t.pair_link("a", "b")


def test_yaml_round_trip(tmp_path: Path) -> None:
    t = fat_tree_tracks(servers=2, gpus_per_server=2, tracks=2, aggregator_slots=4)
    path = tmp_path / "topo.yaml"
    t.to_yaml(path)
    u = Topology.from_yaml(path)
    assert u.gpus() == t.gpus() and u.switch("access0").aggregator_slots == 4
    assert np.array_equal(u.bandwidth_matrix(), t.bandwidth_matrix())
    assert np.array_equal(u.latency_matrix(), t.latency_matrix())


def test_yaml_units_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "gpus: [{id: 0, type: H100, host: n0}, {id: 1, type: H100, host: n1}]\n"
        "switches: [{id: sw}]\n"
        "edges:\n"
        "  - {a: 0, b: sw, kind: ethernet, gbps: 200, latency_us: 5}\n"
        "  - {a: sw, b: 1, kind: ethernet, gbs: 10, latency_s: 0.00001}\n")
    t = Topology.from_yaml(path)
    link = t.pair_link(0, 1)
    assert link.bandwidth == pytest.approx(10e9) and link.latency_s == pytest.approx(15e-6)
    path.write_text("edges: [{a: 0, b: 1, kind: ethernet, gbs: 1}]\n")
    with pytest.raises(SpecError):
        Topology.from_yaml(path)
    path.write_text("- just a list\n")
    with pytest.raises(SpecError):
        Topology.from_yaml(path)


@st.composite
def _graphs(draw: st.DrawFn) -> Topology:
    n_gpu = draw(st.integers(2, 5))
    n_sw = draw(st.integers(0, 3))
    t = Topology()
    for g in range(n_gpu):
        t.add_gpu(g, "H100", f"h{g}")
    for s in range(n_sw):
        t.add_switch(f"s{s}")
    nodes: list[int | str] = list(range(n_gpu)) + [f"s{s}" for s in range(n_sw)]
    for i in range(1, len(nodes)):  # a spanning chain keeps it connected
        t.add_edge(nodes[i - 1], nodes[i], "ethernet",
                   gbs=draw(st.floats(0.1, 100)), latency_s=draw(st.floats(0, 1e-3)))
    for _ in range(draw(st.integers(0, 6))):
        a, b = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        if a != b:
            t.add_edge(a, b, "wan", gbs=draw(st.floats(0.1, 100)),
                       latency_s=draw(st.floats(0, 1e-3)))
    return t


@settings(max_examples=60, deadline=None)
@given(_graphs(), st.floats(0, 1e8))
def test_path_laws(t: Topology, n_bytes: float) -> None:
    ids = t.gpus()
    sp = t.shortest_paths(n_bytes)
    wp = t.widest_paths()

    def cost(a: int | str, b: int | str) -> float:
        return sp[(a, b)].time(n_bytes, store_and_forward=True)

    for a in ids:
        for b in ids:
            if a == b:
                continue
            assert cost(a, b) == pytest.approx(cost(b, a), rel=1e-9, abs=1e-15)
            assert wp[(a, b)].bottleneck >= sp[(a, b)].bottleneck * (1 - 1e-12)
            for c in ids:
                if c not in (a, b):
                    assert cost(a, b) <= cost(a, c) + cost(c, b) + 1e-12
                    assert wp[(a, b)].bottleneck >= min(wp[(a, c)].bottleneck,
                                                        wp[(c, b)].bottleneck) * (1 - 1e-12)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                    st.text(max_size=5))
_entry = st.dictionaries(st.sampled_from(["id", "type", "host", "a", "b", "kind", "gbps", "gbs",
                                          "bytes_per_s", "latency_s", "latency_us",
                                          "aggregator_slots"]), _scalar, max_size=7)


@settings(max_examples=200, deadline=None)
@given(st.one_of(_scalar, st.lists(_entry, max_size=3),
                 st.fixed_dictionaries({}, optional={"gpus": st.lists(_entry, max_size=3),
                                                     "switches": st.lists(_entry, max_size=3),
                                                     "edges": st.lists(_entry, max_size=4)})))
def test_hostile_topology_documents_raise_spec_errors_only(doc: object) -> None:
    try:
        t = Topology.from_dict(doc)
    except SpecError:
        return
    t.bandwidth_matrix()  # whatever was accepted is a usable graph


@pytest.mark.parametrize(("doc", "match"), [
    ({"edges": [5]}, r"topology edges\[0\] must be a mapping, got 5"),
    ({"gpus": ["gpu0"]}, r"topology gpus\[0\] must be a mapping"),
    ({"switches": [{"id": "s"}, [1]]}, r"topology switches\[1\] must be a mapping"),
    ({"gpus": {"id": 0, "type": "H100"}}, r"topology gpus must be a list"),
    ({"gpus": [{"id": 0}]}, r"topology gpus\[0\] lacks the key 'type'"),
    ({"gpus": [{"id": 0, "type": "H100"}, {"id": 0, "type": "H100"}]},
     r"topology gpus\[1\]: node 0 already exists"),
    ({"gpus": [{"id": 0, "type": "H100"}, {"id": 1, "type": "H100"}],
      "edges": [{"a": 0, "b": 1, "kind": "wan", "gbs": "x"}]}, r"topology edges\[0\]: .*'x'"),
])
def test_yaml_entries_must_be_mappings_and_errors_name_them(doc: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        Topology.from_dict(doc)
