"""Algorithm 1 end to end on the paper's testbed shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfabric.scheduler.netplan.planner import candidates, plan, used_gpus
from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
from llmfabric.sim.costs import cost_model_for
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import Topology, fat_tree_tracks

pytestmark = pytest.mark.unit

TESTBED = Path(__file__).parents[4] / "examples" / "heroserve" / "testbed-2tracks.yaml"


def make_testbed_problem(**kw: object) -> NetProblem:
    topo = Topology.from_yaml(TESTBED)
    return NetProblem.of(topo, "opt-66b", "a100-*", "v100-*", NetWorkload(1.0, 512, 256),
                         2.5, 0.15, **kw)


def test_candidates_respect_memory_and_order() -> None:
    p = make_testbed_problem()
    cands = candidates(p)
    assert 1 <= len(cands) <= 20
    totals = [used_gpus(8, a, b) + used_gpus(8, c, d) for a, b, c, d in cands]
    assert totals == sorted(totals, reverse=True)
    assert cands[0] == (8, 1, 8, 1)  # all 16 GPUs, no pipeline
    # OPT-66B (131 GB) at R_frac 0.8: >= 5 A100-40GB and >= 6 V100-32GB
    assert all(a * b >= 5 and c * d >= 6 for a, b, c, d in cands)


def test_plan_is_feasible_deterministic_and_simulatable() -> None:
    p = make_testbed_problem()
    first, second = plan(p), plan(p)
    assert first.to_json() | {"planner_s": 0} == second.to_json() | {"planner_s": 0}
    assert first.H > 0 and first.T_pre <= 2.5 and first.T_dec <= 0.15
    assert first.per_gpu_rate == pytest.approx(first.H / first.n_gpus)
    pre, dec = first.to_deployments()
    assert dec.n_gpus == first.p_all[2] * first.p_all[3]
    assert pre.n_gpus == first.p_all[0] * first.p_all[1]
    # the deployment carries the plan's costs: the simulator's prefill equals T_pre
    assert cost_model_for(pre).prefill_time([512]) == pytest.approx(first.T_pre)
    assert len(pre.stage_allreduces) == pre.pp
    link = first.kv_stage_link(0, 0, 0, 0)
    assert link.bandwidth > 0
    used = {g for inst in first.prefill_groups for st in inst for g in st}
    assert used <= set(p.prefill_gpus)


def test_tighter_sla_never_raises_h() -> None:
    loose = plan(make_testbed_problem()).H
    p = make_testbed_problem()
    strict = NetProblem(p.topology, p.model, p.prefill_gpus, p.decode_gpus, p.workload,
                        0.5, 0.15)
    strict_h = plan(strict).H
    assert strict_h <= loose + 1e-9


def test_model_too_big_raises() -> None:
    topo = fat_tree_tracks(servers=1, gpus_per_server=2, tracks=1, gpu_types="V100")
    with pytest.raises(SpecError):
        plan(NetProblem.of(topo, "opt-66b", ["gpu0"], ["gpu1"], NetWorkload(1, 10, 10),
                           1.0, 1.0))


@pytest.mark.parametrize("name,servers,tracks", [("testbed-2tracks", 4, 2),
                                                  ("unit-2tracks", 6, 2),
                                                  ("unit-8tracks", 16, 8)])
def test_example_topologies_are_the_generator(name: str, servers: int, tracks: int) -> None:
    got = Topology.from_yaml(TESTBED.parent / f"{name}.yaml").to_dict()
    if name.startswith("testbed"):
        want = fat_tree_tracks(servers=4, gpus_per_server=4, tracks=2, nic_gbps=100,
                               nvlink_gbs=300, gpu_types=["A100-40GB"] * 2 + ["V100"] * 2,
                               aggregator_slots=8)
    else:
        want = fat_tree_tracks(servers=servers, gpus_per_server=8, tracks=tracks,
                               nic_gbps=100, nvlink_gbs=300, core=1, core_gbps=400,
                               gpu_types="A100-80GB", aggregator_slots=8)
    assert got == want.to_dict()


def test_sla_rate_meets_the_attainment_it_reports() -> None:
    from llmfabric.scheduler.netplan.runner import serve, sla_rate

    p = plan(make_testbed_problem())
    rate = sla_rate(p, duration=20.0, iters=5)
    assert 0 < rate <= 2 * p.H
    assert serve(p, rate, 20.0)["slo_attainment"] >= 0.9
    with pytest.raises(SpecError):
        sla_rate(p, attainment=0.0)
