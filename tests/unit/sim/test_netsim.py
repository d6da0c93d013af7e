"""Flow-level simulator: exact max-min shares and completion times on small graphs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim.errors import SpecError
from llmfabric.sim.netsim import FlowSim, max_min_rates
from llmfabric.sim.topology import Topology

pytestmark = pytest.mark.unit


def line() -> Topology:
    """a -- s -- b at 10 B/s, c -- s at 5 B/s, 1 s latency on s -- b."""
    t = Topology()
    t.add_switch("s")
    for g in ("a", "b", "c"):
        t.add_gpu(g, "A100-40GB", g)
    t.add_edge("a", "s", "ethernet", bytes_per_s=10)
    t.add_edge("s", "b", "ethernet", bytes_per_s=10, latency_s=1.0)
    t.add_edge("c", "s", "ethernet", bytes_per_s=5)
    return t


def test_max_min_textbook() -> None:
    cap = {("x", "y"): 10.0, ("y", "z"): 4.0}
    # f0 on both links, f1 on y->z, f2 on x->y: y->z gives 2 each, f2 takes the rest 8
    assert max_min_rates([[("x", "y"), ("y", "z")], [("y", "z")], [("x", "y")]],
                         cap) == [2.0, 2.0, 8.0]


def test_two_flows_share_then_one_speeds_up() -> None:
    sim = FlowSim(line())
    f0 = sim.add_flow(["a", "s", "b"], 100, 0.0)
    f1 = sim.add_flow(["c", "s", "b"], 20, 0.0)
    res = sim.run()
    # s->b shared: f1 limited to 5 by its own link, f0 gets 5; f1 done at 4 s (+1 s latency),
    # then f0 has 80 left at 10 B/s: done at 12 s (+1 s)
    assert res.finish[f1] == pytest.approx(5.0)
    assert res.finish[f0] == pytest.approx(13.0)
    assert res.peak_utilisation(("s", "b")) == pytest.approx(1.0)
    assert res.bytes_through(("s", "b"), 10) == pytest.approx(120.0)


def test_opposite_directions_do_not_share_and_late_start() -> None:
    sim = FlowSim(line())
    f0 = sim.add_flow(["a", "s"], 50, 0.0)
    f1 = sim.add_flow(["s", "a"], 50, 0.0)
    f2 = sim.add_flow(["a", "s"], 10, 2.0)
    res = sim.run()
    assert res.finish[f1] == pytest.approx(5.0)
    # f0 alone for 2 s (20 B), then shares with f2 at 5 B/s: f2 done at 4 s, f0 at 5 + 1
    assert res.finish[f2] == pytest.approx(4.0)
    assert res.finish[f0] == pytest.approx(6.0)
    with pytest.raises(SpecError):
        sim.add_flow(["a", "b"], 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([["a", "s", "b"], ["c", "s", "b"], ["a", "s"]]),
                          st.floats(1, 1000), st.floats(0, 10)), min_size=1, max_size=6))
def test_bytes_conserved_and_no_link_over_capacity(flows: list[tuple[list[str], float,
                                                                     float]]) -> None:
    sim = FlowSim(line())
    ids = [sim.add_flow(p, b, t) for p, b, t in flows]
    res = sim.run()
    for fid, (path, b, t) in zip(ids, flows, strict=True):
        lat = 1.0 if path[-1] == "b" else 0.0
        cap = min(5.0 if "c" in path else 10.0, 10.0)
        assert res.finish[fid] >= t + b / cap + lat - 1e-6
    for seg in res.segments:
        assert all(u <= 1 + 1e-9 for u in seg.utilisation.values())
    sent = sum(b for p, b, _ in flows if p[-1] == "b")
    assert res.bytes_through(("s", "b"), 10) == pytest.approx(sent, rel=1e-6)
