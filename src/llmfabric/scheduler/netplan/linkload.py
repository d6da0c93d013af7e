"""Steady-state bytes a plan pushes over each directed link, and the rate the links allow.

The analytic costs (commcost.py) price every transfer alone; H must also keep the aggregate
load of all of them on each link below its capacity. At total rate lambda, spread evenly over
the instances (a request's prefill and decode instance independent and uniform), one request
puts on each directed edge e `w_e` bytes:

- prefill: mean_in tokens through every stage of a prefill instance; per token and layer two
  all-reduces of hidden x act_bits / 8 bytes per member (as `sim.costs`), and per token one
  activation of that size per pipeline boundary, sent by eq. 6's sender (`pp_sender`) to
  every member of the next stage;
- decode: mean_out tokens the same way on a decode instance (the logits gather, ~1 % of a
  token's all-reduce bytes for OPT-175B at TP8, is left out);
- KV: `commcost.kv_sends` of mean_in tokens over the plan's KV routes, averaged over the
  (prefill, decode) instance pairs (an even sample of MAX_PAIRS when there are more).

An all-reduce of m bytes per member puts m x `LinkLoad` on the group's edges: a ring sends
2 (P-1) / P x m per member over its hop to the next member (`ring_load`), INA sends m up each
member's route to the switch and m back down (`ina_load`). Each edge is priced at its
own capacity, each direction (full duplex, as `commcost._shared`).

`link_rate` is the stability bound: lambda x w_e <= util x C_e on every edge. `KvQueue` is
the KV hand-off's wait behind other requests' hand-offs on a shared link (Pollaczek-Khinchine,
M/G/1 FIFO per link; one request's bytes on the link are one job): W_e = lambda E[S_e^2] /
(2 (1 - rho_e)), rho_e the link's whole utilisation (all-reduce and PP bytes included, their
own burst sizes not), the largest W_e over the KV links (the bottleneck link).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmfabric.scheduler.netplan.commcost import StageGPUs, ina_routes, kv_sends, ring_order
from llmfabric.scheduler.netplan.paths import DirectedEdge, PathRoute, Routes
from llmfabric.sim.errors import SpecError
from llmfabric.sim.models import ModelSpec
from llmfabric.sim.topology import NodeId, Topology

MAX_PAIRS = 1024  # instance pairs averaged for the KV load; an even sample beyond


@dataclass
class LinkLoad:
    """Bytes on each directed edge (per byte, per token or per request, by context) and the
    capacity (bytes/s, each direction) of the edge that carries them."""

    bytes: dict[DirectedEdge, float] = field(default_factory=dict)
    capacity: dict[DirectedEdge, float] = field(default_factory=dict)

    def add_route(self, route: PathRoute, n_bytes: float) -> None:
        for d, e in zip(route.directed(), route.edges, strict=True):
            self.bytes[d] = self.bytes.get(d, 0.0) + n_bytes
            # two edges of other kinds may join one pair of nodes: keep the narrower
            self.capacity[d] = min(self.capacity.get(d, math.inf), e.capacity)

    def add(self, other: LinkLoad, scale: float = 1.0) -> None:
        for d, b in other.bytes.items():
            self.bytes[d] = self.bytes.get(d, 0.0) + b * scale
            self.capacity[d] = min(self.capacity.get(d, math.inf), other.capacity[d])

    def scaled(self, scale: float) -> LinkLoad:
        out = LinkLoad()
        out.add(self, scale)
        return out


def mean_load(loads: Sequence[LinkLoad]) -> LinkLoad:
    out = LinkLoad()
    for ld in loads:
        out.add(ld, 1.0 / len(loads))
    return out


def ring_load(topology: Topology, group: Sequence[NodeId], routes: Routes) -> LinkLoad:
    """Bytes per edge per byte all-reduced by each member of a ring: 2 (P-1) / P on every
    edge of each member's hop to the next (several hops on one edge add up)."""
    out = LinkLoad()
    order = ring_order(topology, group)
    p = len(order)
    if p <= 1:
        return out
    for k in range(p):
        out.add_route(routes.route(order[k], order[(k + 1) % p]), 2 * (p - 1) / p)
    return out


def ina_load(
    group: Sequence[NodeId], switch: NodeId, routes: Routes, *, spread: bool = False
) -> LinkLoad:
    """Bytes per edge per byte all-reduced by each member of an INA group: 1 up each
    member's route to the switch and 1 down its route back (`commcost.ina_routes`: with
    `spread` the least-loaded-NIC routes HeroServe prices)."""
    out = LinkLoad()
    if len(group) <= 1:
        return out
    up, down = ina_routes(routes.topology, group, switch, routes, spread=spread)
    for route in (*up, *down):
        out.add_route(route, 1.0)
    return out


def pp_sender(
    routes: Routes,
    src: Sequence[NodeId],
    dst: Sequence[NodeId],
    nbytes: float,
    hop_latency: float | None,
) -> tuple[NodeId, PathRoute]:
    """Eq. 6's boundary: the sender whose slowest receiver is reached first, and that route."""
    best: tuple[float, NodeId, PathRoute] | None = None
    for a in src:
        worst = max((routes.route(a, k) for k in dst), key=lambda r: r.time(nbytes, hop_latency))
        t = worst.time(nbytes, hop_latency)
        if best is None or t < best[0]:
            best = (t, a, worst)
    if best is None:
        raise SpecError("a pipeline boundary needs a sending stage")
    return best[1], best[2]


def pp_load(routes: Routes, sender: NodeId, dst: Sequence[NodeId]) -> LinkLoad:
    """Bytes per edge per activation byte: the sender sends it to every receiver."""
    out = LinkLoad()
    for k in dst:
        out.add_route(routes.route(sender, k), 1.0)
    return out


def instance_pairs(n_pre: int, n_dec: int) -> list[tuple[int, int]]:
    pairs = [(i, j) for i in range(n_pre) for j in range(n_dec)]
    return pairs[:: math.ceil(len(pairs) / MAX_PAIRS)]


@dataclass(frozen=True)
class KvLoad:
    """Per request: mean KV bytes on each edge, and the mean of the squared per-request
    service seconds there (E[S^2], for the wait)."""

    mean: LinkLoad
    service_sq: dict[DirectedEdge, float]


def kv_load(
    model: ModelSpec,
    prefill: Sequence[Sequence[StageGPUs]],
    decode: Sequence[Sequence[StageGPUs]],
    n_tokens: float,
    routes: Routes,
) -> KvLoad:
    """The KV hand-off of one request of `n_tokens`, averaged over instance pairs."""
    pairs = instance_pairs(len(prefill), len(decode))
    if not pairs:
        raise SpecError("a KV load needs a prefill and a decode instance")
    mean, sq = LinkLoad(), dict[DirectedEdge, float]()
    for i, j in pairs:
        one = LinkLoad()
        for k, sends in kv_sends(model, prefill[i], decode[j], n_tokens).items():
            for z, b in sends:
                if k != z:
                    one.add_route(routes.route(k, z), b)
        mean.add(one, 1.0 / len(pairs))
        for d, b in one.bytes.items():
            sq[d] = sq.get(d, 0.0) + (b / one.capacity[d]) ** 2 / len(pairs)
    return KvLoad(mean, sq)


@dataclass(frozen=True)
class LinkBound:
    """The largest rate the links carry (`rate`, +inf when nothing crosses one) and the edge
    that decides it."""

    rate: float
    edge: DirectedEdge | None

    @property
    def name(self) -> str:
        return "" if self.edge is None else f"link:{self.edge[0]}->{self.edge[1]}"


def link_rate(per_request: LinkLoad, util: float) -> LinkBound:
    """min over edges of util x C_e / w_e (ties: the first edge in sorted order)."""
    if not 0 < util <= 1:
        raise SpecError("the link utilisation cap must be in (0, 1]")
    best = LinkBound(math.inf, None)
    for d in sorted(per_request.bytes, key=lambda d: (str(d[0]), str(d[1]))):
        w = per_request.bytes[d]
        if w > 0 and util * per_request.capacity[d] / w < best.rate:
            best = LinkBound(util * per_request.capacity[d] / w, d)
    return best


def utilisation(per_request: LinkLoad, rate: float) -> tuple[float, DirectedEdge | None]:
    """The most loaded edge's utilisation at `rate` (0, None when nothing crosses a link)."""
    top: tuple[float, DirectedEdge | None] = (0.0, None)
    for d in sorted(per_request.bytes, key=lambda d: (str(d[0]), str(d[1]))):
        u = rate * per_request.bytes[d] / per_request.capacity[d]
        if u > top[0]:
            top = (u, d)
    return top


class KvQueue:
    """The KV hand-off's mean wait at rate lambda on its bottleneck link (module docstring)."""

    def __init__(self, per_request: LinkLoad, kv: KvLoad) -> None:
        self._terms = [
            (per_request.bytes[d] / per_request.capacity[d], s2)
            for d, s2 in kv.service_sq.items()
            if s2 > 0
        ]

    def wait(self, rate: float) -> float:
        worst = 0.0
        for w_over_c, s2 in self._terms:
            rho = rate * w_over_c
            if rho >= 1:
                return math.inf
            worst = max(worst, rate * s2 / (2 * (1 - rho)))
        return worst


def total(parts: Iterable[tuple[LinkLoad, float]]) -> LinkLoad:
    out = LinkLoad()
    for ld, scale in parts:
        out.add(ld, scale)
    return out
