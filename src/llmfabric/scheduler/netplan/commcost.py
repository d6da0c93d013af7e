"""HeroServe's communication costs (eqs. 5-15) over a topology, in bytes and seconds.

Every function takes `hop_latency`: None prices each hop with its edge's own latency, a
number replaces it per hop, and 0 gives the paper's pure-bandwidth form (its Fig. 2 example).

- `t_ina` / `ina_breakdown` (eqs. 8-10): every member sends its whole message up its route to
  the aggregation switch, which sums (`t_agg`, ~1 us) and sends the result back down; a
  member's collect time is store and forward, sum over hops of bytes / B_e; the slowest member
  decides each phase.
- INA member routes (`ina_routes`): each member's Dijkstra route, or with `spread=True`
  (HeroServe only: planner, Alg. 2 grouping, link loads) NVLink forwarding to the
  least-loaded NIC (spread.py); the baselines keep Dijkstra's (Ethernet-only) routes.
- `t_ring` (eq. 11): 2(P-1) steps of bytes / P over the ring's narrowest hop, plus 2(P-1) x
  the slowest hop's latency.
- Members of one group whose routes cross the same directed edge share it (the paper
  prices each route alone; two GPUs forwarding through one NIC would then cost nothing
  extra): a shared edge counts `n_e / B_e` per byte. With disjoint routes this is exactly
  the paper's form.
- `t_pp` (eq. 6): stage i -> i+1 activations, min over senders of the max over receivers.
- `t_kv` (eqs. 14-15): every prefill GPU sends the KV cells (layer, head shard) that a decode
  GPU holds, one after another; the slowest sender decides.
- `net_s` (every all-reduce function; 0 = the paper's form): a fixed cost per collective
  that leaves the server (INA always; a ring whose members sit on more than one host): the
  NIC/RDMA proxy path's latency, which the per-hop latencies miss. Measured on DGX-A100
  (`../shared/data` vidur a100_dgx all_reduce, messages <= 64 KB, per-size minima): 20-33
  us within a node for 2-8 ranks, 41-74 us across two nodes for 2-16 ranks; the cross-node
  excess over the intra-node line is 15-38 us, mean 31 us: `NET_COLLECTIVE_S` = 30 us.
  Both schemes pay it when they leave the server (no INA measurement says otherwise), so
  it never favours one for a group that spans servers; a ring inside one server does not
  pay it, so there it adds to INA's side.
- `choose_scheme`: the per-group choice of Algorithm 2 (the switch with a free aggregator
  slot where INA is fastest, then the cheaper of INA and ring); `group_allreduce` turns
  the choice into an `AllReduceModel` for `Deployment.stage_allreduces`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from llmfabric.scheduler.netplan.paths import DirectedEdge, PathRoute, Routes
from llmfabric.scheduler.netplan.spread import down_routes, spread_routes
from llmfabric.sim.collectives import AllReduceModel, ina_model, ring_over_path
from llmfabric.sim.errors import SpecError
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.parallel import kv_transfer_bytes
from llmfabric.sim.topology import NodeId, Topology

T_AGG_S = 1e-6  # switch aggregation time (paper: ~1 us on Tofino)
NET_COLLECTIVE_S = 30e-6  # fixed cost of a collective through the NICs (module docstring)
Scheme = Literal["ina", "ring"]


@dataclass(frozen=True, slots=True)
class PricedPath:
    """A route priced for one collective: latency and seconds per byte (sharing included)."""

    latency_s: float
    inverse_bw_sum: float

    def time(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes * self.inverse_bw_sum


@dataclass(frozen=True, slots=True)
class InaBreakdown:
    collect_s: float
    agg_s: float
    distribute_s: float
    net_s: float = 0.0  # the fixed cost of going through the NICs (`NET_COLLECTIVE_S`)

    @property
    def total_s(self) -> float:
        return self.collect_s + self.agg_s + self.distribute_s + self.net_s


@dataclass(frozen=True, slots=True)
class SchemeChoice:
    scheme: Scheme
    switch: NodeId | None
    t_ina: float  # +inf when no switch was available
    t_ring: float


def _routes(topology: Topology, routes: Routes | None, n_bytes: float) -> Routes:
    if routes is not None:
        if routes.topology is not topology:
            raise SpecError("routes were computed on another topology")
        return routes
    return Routes(topology, n_bytes)


def _check_group(topology: Topology, group: Sequence[NodeId]) -> list[NodeId]:
    members = list(group)
    if not members or len(set(members)) != len(members):
        raise SpecError("a TP group needs >= 1 distinct GPU")
    for g in members:
        topology.gpu(g)
    return members


def _shared(paths: Sequence[PathRoute], hop_latency: float | None) -> list[PricedPath]:
    """Price concurrent routes: an edge direction used by n of them gives each 1/n of it."""
    load: Counter[DirectedEdge] = Counter()
    for p in paths:
        load.update(p.directed())
    out = []
    for p in paths:
        inv = sum(load[d] / e.capacity for d, e in zip(p.directed(), p.edges, strict=True))
        out.append(PricedPath(p.latency(hop_latency), inv))
    return out


def ina_routes(topology: Topology, group: Sequence[NodeId], switch: NodeId, routes: Routes,
               *, spread: bool = False) -> tuple[list[PathRoute], list[PathRoute]]:
    """Up (member -> switch) and down routes of an INA group: each member's Dijkstra route,
    or with `spread` HeroServe's NVLink forwarding to the least-loaded NIC (spread.py)."""
    members = _check_group(topology, group)
    topology.switch(switch)
    if spread:
        up = spread_routes(topology, members, switch, routes)
        return up, down_routes(up)
    return ([routes.route(g, switch) for g in members],
            [routes.route(switch, g) for g in members])


def ina_paths(topology: Topology, group: Sequence[NodeId], switch: NodeId, *,
              hop_latency: float | None = None, routes: Routes | None = None,
              n_bytes: float = 1 << 20, spread: bool = False
              ) -> tuple[list[PricedPath], list[PricedPath]]:
    """Priced up (member -> switch) and down (switch -> member) paths of an INA group."""
    r = _routes(topology, routes, n_bytes)
    up, down = ina_routes(topology, group, switch, r, spread=spread)
    return _shared(up, hop_latency), _shared(down, hop_latency)


def _check_net(net_s: float) -> None:
    if not 0 <= net_s < float("inf"):
        raise SpecError("net_s must be a finite number of seconds >= 0")


def crosses_servers(topology: Topology, group: Sequence[NodeId]) -> bool:
    """Whether the group's members sit on more than one host (a ring then uses the NICs)."""
    return len({topology.gpu(g).host for g in group}) > 1


def ina_breakdown(topology: Topology, group: Sequence[NodeId], switch: NodeId, nbytes: float,
                  *, hop_latency: float | None = None, t_agg: float = T_AGG_S,
                  routes: Routes | None = None, net_s: float = 0.0,
                  spread: bool = False) -> InaBreakdown:
    """Collect / aggregate / distribute seconds of one INA all-reduce of `nbytes` per member
    (+ `net_s`, the fixed cost of going through the NICs); `spread`: `ina_routes`."""
    if nbytes < 0:
        raise SpecError("nbytes must be >= 0")
    _check_net(net_s)
    if len(group) <= 1:
        _check_group(topology, group)
        return InaBreakdown(0.0, 0.0, 0.0)
    up, down = ina_paths(topology, group, switch, hop_latency=hop_latency, routes=routes,
                         n_bytes=nbytes, spread=spread)
    return InaBreakdown(max(p.time(nbytes) for p in up), t_agg,
                        max(p.time(nbytes) for p in down), net_s)


def t_ina(topology: Topology, group: Sequence[NodeId], switch: NodeId, nbytes: float, *,
          hop_latency: float | None = None, t_agg: float = T_AGG_S,
          routes: Routes | None = None, net_s: float = 0.0, spread: bool = False) -> float:
    """Seconds of one whole INA all-reduce (eq. 8: collect + aggregate + distribute, + net_s)."""
    return ina_breakdown(topology, group, switch, nbytes, hop_latency=hop_latency,
                         t_agg=t_agg, routes=routes, net_s=net_s, spread=spread).total_s


def ring_order(topology: Topology, group: Sequence[NodeId]) -> list[NodeId]:
    """The ring's member order: topology order (server mates adjacent, as NCCL orders)."""
    index = {g: k for k, g in enumerate(topology.gpus())}
    return sorted(_check_group(topology, group), key=lambda g: index[g])


def ring_link(topology: Topology, group: Sequence[NodeId], *,
              hop_latency: float | None = None, routes: Routes | None = None,
              n_bytes: float = 1 << 20) -> tuple[float, float]:
    """(bottleneck bytes/s, per-step latency s) of the group's ring: all members send to the
    next at once, so hops crossing one edge direction share it."""
    order = ring_order(topology, group)
    r = _routes(topology, routes, n_bytes)
    hops = [r.route(order[k], order[(k + 1) % len(order)]) for k in range(len(order))]
    load: Counter[DirectedEdge] = Counter()
    for h in hops:
        load.update(h.directed())
    bw = min(e.capacity / load[d] for h in hops
             for d, e in zip(h.directed(), h.edges, strict=True))
    return bw, max(h.latency(hop_latency) for h in hops)


def t_ring(topology: Topology, group: Sequence[NodeId], nbytes: float, *,
           hop_latency: float | None = None, routes: Routes | None = None,
           net_s: float = 0.0) -> float:
    """Seconds of one ring all-reduce of `nbytes` per member (eq. 11 + per-step latency, +
    `net_s` when the members span servers)."""
    if nbytes < 0:
        raise SpecError("nbytes must be >= 0")
    _check_net(net_s)
    p = len(_check_group(topology, group))
    if p <= 1:
        return 0.0
    bw, lat = ring_link(topology, group, hop_latency=hop_latency, routes=routes,
                        n_bytes=nbytes)
    net = net_s if crosses_servers(topology, group) else 0.0
    return net + 2 * (p - 1) * lat + 2 * (p - 1) * (nbytes / p) / bw


def t_pp(topology: Topology, src_group: Sequence[NodeId], dst_group: Sequence[NodeId],
         nbytes: float, *, hop_latency: float | None = None,
         routes: Routes | None = None) -> float:
    """Eq. 6: activations of `nbytes` from pipeline group i to group i+1: the best sender's
    time to reach the slowest receiver."""
    src = _check_group(topology, src_group)
    dst = _check_group(topology, dst_group)
    r = _routes(topology, routes, nbytes)
    return min(max(r.route(a, k).time(nbytes, hop_latency) for k in dst) for a in src)


@dataclass(frozen=True, slots=True)
class StageGPUs:
    """One pipeline stage of a plan: its TP group (shard j = gpus[j]) and layers [start, end)."""

    gpus: tuple[NodeId, ...]
    layers: tuple[int, int]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def kv_sends(model: ModelSpec, prefill: Sequence[StageGPUs], decode: Sequence[StageGPUs],
             n_tokens: float, *, bits: int | None = None
             ) -> dict[NodeId, list[tuple[NodeId, float]]]:
    """Per prefill GPU, (decode GPU, bytes) for every decode GPU holding some of its KV cells
    (same layers, overlapping head shards): D = 2 x tokens x kv_dim / P_tens x bytes per layer."""
    per_layer = kv_transfer_bytes(model, n_tokens, bits) / model.n_layers
    out: dict[NodeId, list[tuple[NodeId, float]]] = {}
    for ps in prefill:
        np_ = len(ps.gpus)
        for j, k in enumerate(ps.gpus):
            sends = out.setdefault(k, [])
            for ds in decode:
                layers = _overlap(*ps.layers, *ds.layers)
                if layers <= 0:
                    continue
                nd = len(ds.gpus)
                for jj, z in enumerate(ds.gpus):
                    share = _overlap(j / np_, (j + 1) / np_, jj / nd, (jj + 1) / nd)
                    if share > 0:
                        sends.append((z, per_layer * layers * share))
    return out


def t_kv(topology: Topology, model: ModelSpec, prefill: Sequence[StageGPUs],
         decode: Sequence[StageGPUs], n_tokens: float, *, hop_latency: float | None = None,
         routes: Routes | None = None, bits: int | None = None) -> float:
    """Eqs. 14-15: seconds to hand one request's KV from the prefill to the decode instance;
    each prefill GPU sends its cells one after another (sum), the slowest sender decides."""
    r = _routes(topology, routes, 1 << 20)
    worst = 0.0
    for k, sends in kv_sends(model, prefill, decode, n_tokens, bits=bits).items():
        worst = max(worst, sum(r.route(k, z).time(b, hop_latency) for z, b in sends))
    return worst


def nearest_switch(topology: Topology, group: Sequence[NodeId], nbytes: float, *,
                   free_slots: Mapping[NodeId, int] | None = None,
                   hop_latency: float | None = None, routes: Routes | None = None,
                   candidates: Sequence[NodeId] | None = None) -> NodeId | None:
    """The switch with a free aggregator slot whose slowest member route is shortest
    (Alg. 2 line 7); None when no switch has a free slot or none is reachable."""
    members = _check_group(topology, group)
    r = _routes(topology, routes, nbytes)
    slots = free_slots if free_slots is not None else {
        s: topology.switch(s).aggregator_slots for s in topology.switches()}
    best: tuple[float, int, NodeId] | None = None
    for k, s in enumerate(candidates if candidates is not None else topology.switches()):
        if slots.get(s, 0) < 1 or not all(r.reachable(g, s) for g in members):
            continue
        d = max(r.route(g, s).time(nbytes, hop_latency) for g in members)
        if best is None or (d, k) < best[:2]:
            best = (d, k, s)
    return None if best is None else best[2]


def choose_scheme(topology: Topology, group: Sequence[NodeId], nbytes: float, *,
                  free_slots: Mapping[NodeId, int] | None = None,
                  hop_latency: float | None = None, t_agg: float = T_AGG_S,
                  routes: Routes | None = None, net_s: float = 0.0,
                  spread: bool = False) -> SchemeChoice:
    """Algorithm 2's per-group choice: INA at the switch with a free aggregator slot where the
    group's whole INA (shared edges included) is fastest, or ring, whichever is cheaper
    (ties: INA, as the paper's `T_ina > T_ring` test). Alg. 2 attaches the switch "with the
    smallest delay to the group"; the INA time is that delay with NIC sharing counted.
    `spread`: members forward to the least-loaded NIC (HeroServe; `ina_routes`)."""
    r = _routes(topology, routes, nbytes)
    ring = t_ring(topology, group, nbytes, hop_latency=hop_latency, routes=r, net_s=net_s)
    if len(group) <= 1:
        return SchemeChoice("ring", None, float("inf"), ring)
    slots = free_slots if free_slots is not None else {
        s: topology.switch(s).aggregator_slots for s in topology.switches()}
    best: tuple[float, int, NodeId] | None = None
    for k, s in enumerate(topology.switches()):
        if slots.get(s, 0) < 1 or not all(r.reachable(g, s) for g in group):
            continue
        t = t_ina(topology, group, s, nbytes, hop_latency=hop_latency, t_agg=t_agg, routes=r,
                  net_s=net_s, spread=spread)
        if best is None or (t, k) < best[:2]:
            best = (t, k, s)
    if best is None:
        return SchemeChoice("ring", None, float("inf"), ring)
    ina, _, switch = best
    return SchemeChoice("ring" if ina > ring else "ina", switch, ina, ring)


def group_allreduce(topology: Topology, group: Sequence[NodeId], scheme: Scheme,
                    switch: NodeId | None, *, hop_latency: float | None = None,
                    t_agg: float = T_AGG_S, routes: Routes | None = None,
                    net_s: float = 0.0, spread: bool = False) -> AllReduceModel:
    """The group's all-reduce as an `AllReduceModel` (for `Deployment.stage_allreduces`);
    `net_s` joins the base latency as in `t_ina` / `t_ring`; `spread` as `ina_routes`."""
    _check_net(net_s)
    if scheme == "ina":
        if switch is None:
            raise SpecError("an INA group needs a switch")
        up, down = ina_paths(topology, group, switch, hop_latency=hop_latency, routes=routes,
                             spread=spread)
        return with_base(ina_model(up, down, t_agg), net_s if len(group) > 1 else 0.0)
    if len(group) <= 1:
        return ring_over_path(1e30, 0.0)
    bw, lat = ring_link(topology, group, hop_latency=hop_latency, routes=routes)
    net = net_s if crosses_servers(topology, group) else 0.0
    return with_base(ring_over_path(bw, lat), net)


def with_base(model: AllReduceModel, extra_s: float) -> AllReduceModel:
    """`model` with `extra_s` more fixed latency per all-reduce (NCCL regime; planned groups
    carry no custom regime)."""
    if extra_s == 0.0:
        return model
    return replace(model, nccl=replace(model.nccl, base_s=model.nccl.base_s + extra_s))
