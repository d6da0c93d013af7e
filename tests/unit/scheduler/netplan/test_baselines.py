"""Baselines on the paper's testbed: same pricing, their own placement and schemes."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfabric.scheduler.netplan.baselines import (
    access_switches,
    core_switches,
    distserve,
    ds_atp,
    ds_switchml,
)
from llmfabric.scheduler.netplan.planner import plan
from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
from llmfabric.sim.topology import Topology

pytestmark = pytest.mark.unit

TESTBED = Path(__file__).parents[4] / "examples" / "heroserve" / "testbed-2tracks.yaml"


@pytest.fixture(scope="module")
def problem() -> NetProblem:
    topo = Topology.from_yaml(TESTBED)
    return NetProblem.of(topo, "opt-66b", "a100-*", "v100-*", NetWorkload(1.0, 1792, 256),
                         15.0, 0.15)


def test_switch_roles(problem: NetProblem) -> None:
    assert core_switches(problem.topology) == ["core0"]
    assert access_switches(problem.topology) == ["access0", "access1"]


def test_baselines_use_their_switches_and_heroserve_is_no_worse(problem: NetProblem) -> None:
    hero = plan(problem)
    ds, sml, atp = distserve(problem), ds_switchml(problem), ds_atp(problem)
    assert set(ds.schemes.values()) == {"ring"}
    for base in (ds, sml, atp):
        assert hero.H >= base.H - 1e-9
    assert {s for k, s in sml.ina_switch.items() if sml.schemes[k] == "ina"} <= {"core0"}
    assert {s for k, s in atp.ina_switch.items()
            if atp.schemes[k] == "ina" and s is not None} <= {"access0", "access1"}
    # DistServe keeps a TP group inside a server when it fits
    for inst in ds.decode_groups:
        for group in inst:
            hosts = {problem.topology.gpu(g).host for g in group}
            assert len(hosts) == max(1, len(group) // 4)
