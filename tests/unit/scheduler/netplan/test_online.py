"""Properties of the online policy table (eqs. 16-18) and agreement across members."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.scheduler.netplan.online import (
    Controller,
    Policy,
    PolicyTable,
    candidate_policies,
    run_rounds,
)
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import fat_tree_tracks

pytestmark = pytest.mark.unit

GROUP = ["gpu0", "gpu4", "gpu8", "gpu12"]


def policies() -> list[Policy]:
    topo = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, aggregator_slots=4)
    return candidate_policies(topo, GROUP)


POLICIES = policies()


def test_candidates_cover_ring_and_every_switch() -> None:
    names = {p.name.split("#")[0] for p in POLICIES}
    assert {"ring", "ina@access0", "ina@access1", "ina@core0"} <= names
    assert [p.id for p in POLICIES] == list(range(len(POLICIES)))
    with pytest.raises(SpecError):
        candidate_policies(fat_tree_tracks(servers=1, gpus_per_server=2), ["gpu0"])


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1e9), st.floats(0, 1e9), st.floats(0, 5), st.floats(0, 5))
def test_cost_monotone_in_load(d1: float, d2: float, b1: float, b2: float) -> None:
    table = PolicyTable(GROUP, POLICIES)
    c = POLICIES[1]
    lo, hi = sorted((d1, d2))
    assert table.cost(c, lo) <= table.cost(c, hi)
    table.b[c.id] = min(b1, b2)
    low = table.cost(c, lo)
    table.b[c.id] = max(b1, b2)
    assert table.cost(c, lo) >= low
    assert table.cost(c, lo) == pytest.approx(max(b1, b2) + lo / (table.t_u * c.capacity))


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1), st.dictionaries(st.sampled_from(sorted({e for p in POLICIES
                                                                  for e in p.links}, key=str)),
                                        st.floats(0, 1e10), max_size=12))
def test_penalty_smoothing_is_eq18(gamma: float, load: dict[tuple[str, str], float]) -> None:
    table = PolicyTable(GROUP, POLICIES, gamma=gamma)
    before = dict(table.f)
    table.update_penalties(load)
    for (a, c), old in before.items():
        pa, pc = POLICIES[a], POLICIES[c]
        total = sum(load.get(e, 0.0) for e in pc.links)
        w = 0.0 if total <= 0 else sum(load.get(e, 0.0) for e in pa.links & pc.links) / total
        assert table.f[(a, c)] == pytest.approx((1 - gamma) * old + gamma * w)
        assert 0.0 <= table.f[(a, c)] <= 1.0 + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(1, 1e8), min_size=1, max_size=20))
def test_members_agree_and_update_as_eq17(sizes: list[float]) -> None:
    tables = [PolicyTable(GROUP, POLICIES) for _ in GROUP]
    ctrl = Controller(tables)
    for d in sizes:
        picks = {t.choose(d).id for t in tables}
        assert len(picks) == 1
        pick = picks.pop()
        before = dict(tables[0].b)
        ctrl.sync([(pick, d)])
        for c in POLICIES:
            delta = d / (tables[0].t_u * c.capacity)
            expect = delta if c.id == pick else delta * tables[0].f[(pick, c.id)]
            assert tables[0].b[c.id] == pytest.approx(before[c.id] + expect)
        assert len({t.state() for t in tables}) == 1


def test_choice_moves_off_a_loaded_policy_and_decays_back() -> None:
    table = PolicyTable(GROUP, POLICIES)
    first = table.choose(1e6)
    table.b[first.id] = 10.0
    assert table.choose(1e6).id != first.id
    table.decay(table.t_u * 50)
    assert table.b[first.id] == pytest.approx(10.0 * math.exp(-50))
    assert table.choose(1e6).id == first.id


def test_rounds_on_flow_simulator() -> None:
    topo = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, aggregator_slots=4)
    groups = [GROUP, ["gpu1", "gpu5", "gpu9", "gpu13"]]
    res = run_rounds(topo, groups, 4e6, 3, online=True)
    assert len(res.per_round) == 3 and res.mean_s > 0
    # 2 x (P-1)/P x 4 MB over a 12.5 GB/s NIC is a floor for any ring round
    assert min(res.per_round) >= 1.5 * 4e6 / 12.5e9


def test_online_spreads_groups_that_share_nics() -> None:
    # TP4 groups over two servers and both tracks: fixed, all three keep the idle-network
    # favourite (the ring) and collide; online, later groups see earlier picks' load
    topo = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, aggregator_slots=8)
    groups = [["gpu0", "gpu1", "gpu4", "gpu5"], ["gpu8", "gpu9", "gpu12", "gpu13"],
              ["gpu2", "gpu7", "gpu10", "gpu15"]]
    fixed = run_rounds(topo, groups, 16e6, 4, online=False)
    online = run_rounds(topo, groups, 16e6, 4, online=True)
    assert len(set(fixed.choices[0])) == 1
    assert len(set(online.choices[0])) > 1
    assert online.mean_s < fixed.mean_s


def test_a_lone_group_keeps_its_idle_network_choice() -> None:
    topo = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, aggregator_slots=8)
    fixed = run_rounds(topo, [GROUP], 1e6, 4, online=False)
    online = run_rounds(topo, [GROUP], 1e6, 4, online=True)
    assert online.choices == fixed.choices
    assert online.mean_s == pytest.approx(fixed.mean_s)
