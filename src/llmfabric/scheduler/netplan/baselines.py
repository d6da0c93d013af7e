"""HeroServe's baselines on the same topology and the same pricing (`planner.plan_with`).

- DistServe: TP inside a server when it fits (GPUs in topology order, chunks of P_tens), PP
  across servers, NCCL ring for every group, KV over Ethernet-only shortest paths; its
  planner picks the layout as if the KV hand-off were free (HeroServe §I: DistServe-style
  deployment assumes networks of "negligible latency"), and the layout is priced in full.
INA baselines aggregate only groups that span servers; a group inside one server all-reduces
over NVLink with NCCL as in DistServe (no INA system sends intra-server traffic to a switch).

- DS-SwitchML: DistServe's placement; every such group aggregates synchronously at a core switch
  (one not adjacent to any GPU) over Ethernet-only routes while the core's slot pool lasts,
  ring after that.
- DS-ATP: DistServe's placement; best-effort INA at the access switch closest to the group
  (Ethernet only). A group that finds no free slot there sends its chunks to a parameter
  server instead: two more traversals of the switch's slowest uplink each way (ATP's
  fallback); the share of chunks on that path is recorded per group (0 or 1 here: the slot
  pool is allocated per group, not per burst), and its link load counts those traversals.
"""

from __future__ import annotations

from collections.abc import Sequence
from weakref import WeakKeyDictionary

from llmfabric.scheduler.netplan.commcost import (
    T_AGG_S,
    PricedPath,
    group_allreduce,
    ina_paths,
    nearest_switch,
    t_ina,
    t_ring,
    with_base,
)
from llmfabric.scheduler.netplan.grouping import host_order_groups
from llmfabric.scheduler.netplan.linkload import ina_load, ring_load
from llmfabric.scheduler.netplan.paths import PathRoute, Routes
from llmfabric.scheduler.netplan.planner import (
    GroupComm,
    NetPlan,
    Strategy,
    plan_with,
)
from llmfabric.scheduler.netplan.problem import NetProblem
from llmfabric.sim.collectives import ina_model
from llmfabric.sim.topology import NodeId, Topology

ETHERNET = frozenset({"ethernet"})
_ETH_ROUTES: WeakKeyDictionary[Topology, Routes] = WeakKeyDictionary()


def ethernet_routes(topology: Topology) -> Routes:
    routes = _ETH_ROUTES.get(topology)
    if routes is None:
        routes = _ETH_ROUTES[topology] = Routes(topology, 1 << 20, ETHERNET)
    return routes


def core_switches(topology: Topology) -> list[NodeId]:
    """Switches with no GPU attached."""
    gpus = set(topology.gpus())
    return [s for s in topology.switches()
            if not any(e.other(s) in gpus for e in topology.neighbours(s))]


def access_switches(topology: Topology) -> list[NodeId]:
    core = set(core_switches(topology))
    return [s for s in topology.switches() if s not in core]


def _host_groups(problem: NetProblem, gpus: Sequence[NodeId], tp: int, n_groups: int,
                 nbytes: float, routes: Routes) -> tuple[list[list[list[NodeId]]], int]:
    return [host_order_groups(problem, gpus, tp, n_groups)], 0


def _ring(problem: NetProblem, group: Sequence[NodeId], nbytes: float, routes: Routes
          ) -> GroupComm:
    ring = t_ring(problem.topology, group, nbytes, hop_latency=problem.hop_latency,
                  routes=routes, net_s=problem.net_collective_s)
    model = group_allreduce(problem.topology, group, "ring", None,
                            hop_latency=problem.hop_latency, routes=routes,
                            net_s=problem.net_collective_s)
    return GroupComm("ring", None, model, float("inf"), ring,
                     ring_load(problem.topology, group, routes))


def distserve_comm(problem: NetProblem, group: Sequence[NodeId], nbytes: float,
                   free: dict[NodeId, int], routes: Routes) -> GroupComm:
    return _ring(problem, group, nbytes, routes)


def _one_server(problem: NetProblem, group: Sequence[NodeId]) -> bool:
    return len({problem.topology.gpu(g).host for g in group}) <= 1


def switchml_comm(problem: NetProblem, group: Sequence[NodeId], nbytes: float,
                  free: dict[NodeId, int], routes: Routes) -> GroupComm:
    topo = problem.topology
    eth = ethernet_routes(topo)
    if _one_server(problem, group):  # NCCL over NVLink inside a server, as DistServe
        return _ring(problem, group, nbytes, routes)
    switch = None if len(group) <= 1 else nearest_switch(
        topo, group, nbytes, free_slots=free, hop_latency=problem.hop_latency, routes=eth,
        candidates=core_switches(topo))
    if switch is None:
        return _ring(problem, group, nbytes, routes)
    model = group_allreduce(topo, group, "ina", switch, hop_latency=problem.hop_latency,
                            routes=eth, net_s=problem.net_collective_s)
    ina = t_ina(topo, group, switch, nbytes, hop_latency=problem.hop_latency, routes=eth,
                net_s=problem.net_collective_s)
    return GroupComm("ina", switch, model, ina, float("nan"), ina_load(group, switch, eth))


def atp_comm(problem: NetProblem, group: Sequence[NodeId], nbytes: float,
             free: dict[NodeId, int], routes: Routes) -> GroupComm:
    topo = problem.topology
    eth = ethernet_routes(topo)
    if len(group) <= 1 or _one_server(problem, group):
        return _ring(problem, group, nbytes, routes)
    everywhere = {s: 1 for s in topo.switches()}
    switch = nearest_switch(topo, group, nbytes, free_slots=everywhere,
                            hop_latency=problem.hop_latency, routes=eth,
                            candidates=access_switches(topo))
    if switch is None:
        return _ring(problem, group, nbytes, routes)
    up, down = ina_paths(topo, group, switch, hop_latency=problem.hop_latency, routes=eth)
    fallback = 0.0 if free.get(switch, 0) >= 1 else 1.0
    load = ina_load(group, switch, eth)
    if fallback:
        uplink = min((e for e in topo.neighbours(switch) if e.other(switch) not in
                      set(topo.gpus())), key=lambda e: e.capacity, default=None)
        if uplink is not None:  # each member's bytes cross it twice more each way
            far = uplink.other(switch)
            for d in (PathRoute((switch, far), (uplink,)), PathRoute((far, switch), (uplink,))):
                load.add_route(d, 2.0 * len(group))
        extra_inv = 2.0 / uplink.capacity if uplink is not None else 0.0
        extra_lat = 2.0 * (uplink.latency_s if problem.hop_latency is None
                           else problem.hop_latency) if uplink is not None else 0.0
        up = [PricedPath(p.latency_s + extra_lat, p.inverse_bw_sum + extra_inv) for p in up]
        down = [PricedPath(p.latency_s + extra_lat, p.inverse_bw_sum + extra_inv)
                for p in down]
    model = with_base(ina_model(up, down, T_AGG_S), problem.net_collective_s)
    ina = model.time(nbytes, len(group))
    return GroupComm("ina", switch if not fallback else None, model, ina, float("nan"), load,
                     fallback)


# DistServe's placement plans as if KV moved for free (`Strategy.plans_kv`); its layout is
# then priced in full like HeroServe's.
DISTSERVE = Strategy("distserve", _host_groups, distserve_comm, ETHERNET, plans_kv=False)
DS_SWITCHML = Strategy("ds-switchml", _host_groups, switchml_comm, ETHERNET, plans_kv=False)
DS_ATP = Strategy("ds-atp", _host_groups, atp_comm, ETHERNET, plans_kv=False)
BASELINES = (DISTSERVE, DS_SWITCHML, DS_ATP)


def distserve(problem: NetProblem) -> NetPlan:
    return plan_with(problem, DISTSERVE)


def ds_switchml(problem: NetProblem) -> NetPlan:
    return plan_with(problem, DS_SWITCHML)


def ds_atp(problem: NetProblem) -> NetPlan:
    return plan_with(problem, DS_ATP)
