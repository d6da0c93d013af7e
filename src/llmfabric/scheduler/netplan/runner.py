"""Run a network plan in the discrete-event simulator (`llmfabric simulate net`).

`simulate_plan(inputs, system, rate, duration)` rebuilds the problem from the inputs a plan
file records, plans it again with the named system (deterministic for the seed, so this is
the plan in the file), turns every instance into a `ReplicaSpec` (prefill or decode role,
per-stage all-reduce models, per-boundary PP links) and serves a Poisson (or on/off) load
with per-stage KV links (`NetPlan.kv_stage_link`). `online=True` adds the flow-level
comparison of the decode groups' all-reduces: fixed plan vs the online policy table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmfabric.scheduler.netplan.baselines import BASELINES
from llmfabric.scheduler.netplan.online import run_rounds
from llmfabric.scheduler.netplan.planner import HEROSERVE, NetPlan, plan_with
from llmfabric.scheduler.netplan.problem import NetProblem, NetWorkload
from llmfabric.sim import workload as wl
from llmfabric.sim.errors import SpecError
from llmfabric.sim.results import SLO
from llmfabric.sim.serving import ReplicaSpec, simulate_disaggregated
from llmfabric.sim.topology import Topology

STRATEGIES = {s.name: s for s in (HEROSERVE, *BASELINES)}


def problem_from_inputs(inputs: Mapping[str, Any]) -> NetProblem:
    return NetProblem.of(Topology.from_yaml(inputs["topology"]), inputs["model"],
                         inputs["prefill_gpus"], inputs["decode_gpus"],
                         NetWorkload.from_yaml(inputs["workload"]),
                         float(inputs["sla_ttft"]), float(inputs["sla_tpot"]),
                         max_candi=int(inputs.get("max_candidates", 20)),
                         seed=int(inputs.get("seed", 0)),
                         hop_latency=inputs.get("hop_latency"),
                         **({} if inputs.get("net_latency") is None
                            else {"net_collective_s": float(inputs["net_latency"])}))


def serve(plan: NetPlan, rate: float, duration: float, *, arrival: str = "poisson",
          seed: int = 0) -> dict[str, float]:
    """Serve `plan` at `rate` req/s; summary metrics incl. SLO attainment."""
    problem = plan.problem
    if problem is None:
        raise SpecError("the plan carries no problem")
    pre, dec = plan.deployments()
    w = problem.workload
    k_in, k_out = max(1, round(w.mean_in)), max(1, round(w.mean_out))
    if arrival == "poisson":
        load = wl.poisson(rate, duration, k_in, k_out, seed=seed)
    else:
        load = wl.on_off(rate * 2, duration / 10, duration / 10, duration, k_in, k_out,
                         seed=seed)
    res = simulate_disaggregated(
        [ReplicaSpec(d, role="prefill") for d in pre], [ReplicaSpec(d, role="decode")
                                                        for d in dec],
        load, plan.kv_stage_link(0, 0, 0, 0), stage_link=plan.kv_stage_link,
        slo=SLO(ttft_s=problem.sla_pre, tpot_s=problem.sla_dec), seed=seed)
    return {k: float(v) for k, v in res.summary().items()}


def simulate_plan(inputs: Mapping[str, Any], system: str, rate: float, duration: float, *,
                  arrival: str = "poisson", online: bool = False,
                  seed: int = 0) -> dict[str, Any]:
    if system not in STRATEGIES:
        raise SpecError(f"unknown system {system!r}; choose one of {sorted(STRATEGIES)}")
    problem = problem_from_inputs(inputs)
    plan = plan_with(problem, STRATEGIES[system])
    out: dict[str, Any] = {"system": system, "p_all": list(plan.p_all), "H_planned": plan.H,
                           "rate": rate}
    out.update(serve(plan, rate, duration, arrival=arrival, seed=seed))
    if online:
        groups = [g for inst in plan.decode_groups for g in inst if len(g) > 1]
        if groups:
            nbytes = problem.nominal_decode_batch * problem.model.hidden * 2.0
            fixed = run_rounds(problem.topology, groups, nbytes, 10, online=False)
            adaptive = run_rounds(problem.topology, groups, nbytes, 10, online=True)
            out["allreduce_fixed_s"] = fixed.mean_s
            out["allreduce_online_s"] = adaptive.mean_s
    return out


def sla_rate(plan: NetPlan, *, attainment: float = 0.9, duration: float = 60.0,
             seed: int = 0, iters: int = 8) -> float:
    """The paper's metric: the largest Poisson rate whose discrete-event run keeps
    >= `attainment` of requests within both SLAs (bisection over [0, 2 H], H the planner's
    analytic rate; 0 when even a trickle misses)."""
    if not 0 < attainment <= 1 or iters < 1:
        raise SpecError("need 0 < attainment <= 1 and iters >= 1")
    hi = 2.0 * plan.H if plan.H > 0 else 1.0 / max(plan.T_pre, 1e-9)

    def ok(rate: float) -> bool:
        return serve(plan, rate, duration, seed=seed)["slo_attainment"] >= attainment

    if ok(hi):
        return hi
    lo = 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
