"""Flow-level network simulator: flows on paths, max-min fair sharing, event driven.

`FlowSim(topology).add_flow(path, n_bytes, t)` registers a flow that starts at `t` and
crosses the nodes of `path` (consecutive nodes must share an edge; the fastest such edge
is used). Every edge is full duplex: each direction is its own link of the edge's
capacity. `run()` advances from event to event (a flow starting or finishing); between
events every active flow gets its max-min fair rate (progressive filling: the link with
the smallest fair share fixes the rate of its flows, which are then removed from the other
links, and so on). A flow is done when its bytes are through, plus its path's latency
(propagation does not hold bandwidth). Result: per-flow start/finish, and the utilisation
of every loaded link over time as piecewise-constant segments.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import Edge, NodeId, Topology

DirectedLink = tuple[NodeId, NodeId]
_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Flow:
    id: int
    links: tuple[DirectedLink, ...]
    n_bytes: float
    start: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class UtilSegment:
    """Links' utilisation (used / capacity, 0..1) in [t0, t1)."""

    t0: float
    t1: float
    utilisation: dict[DirectedLink, float]


@dataclass
class FlowResult:
    start: dict[int, float]
    finish: dict[int, float]
    segments: list[UtilSegment] = field(default_factory=list)

    def duration(self, flow_id: int) -> float:
        return self.finish[flow_id] - self.start[flow_id]

    def peak_utilisation(self, link: DirectedLink) -> float:
        return max((s.utilisation.get(link, 0.0) for s in self.segments), default=0.0)

    def bytes_through(self, link: DirectedLink, capacity: float) -> float:
        return sum((s.t1 - s.t0) * s.utilisation.get(link, 0.0) * capacity
                   for s in self.segments)


def max_min_rates(flows: Sequence[Sequence[DirectedLink]],
                  capacity: dict[DirectedLink, float]) -> list[float]:
    """Max-min fair rates of flows (each a list of links) by progressive filling."""
    rate = [0.0] * len(flows)
    frozen = [not f for f in flows]  # a flow with no links is not limited by the network
    for k, f in enumerate(flows):
        if not f:
            rate[k] = math.inf
    left = dict(capacity)
    while not all(frozen):
        users: dict[DirectedLink, list[int]] = {}
        for k, f in enumerate(flows):
            if not frozen[k]:
                for link in f:
                    users.setdefault(link, []).append(k)
        link, share = min(((lk, left[lk] / len(ks)) for lk, ks in users.items()),
                          key=lambda x: (x[1], str(x[0])))
        for k in users[link]:
            if frozen[k]:
                continue
            rate[k] = max(0.0, share)
            frozen[k] = True
            for lk in flows[k]:
                left[lk] -= rate[k]
    return rate


class FlowSim:
    """Flows over a topology's full-duplex edges (see the module docstring)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._flows: list[Flow] = []
        self._capacity: dict[DirectedLink, float] = {}

    def _edge(self, a: NodeId, b: NodeId) -> Edge:
        best = None
        for e in self.topology.neighbours(a):
            if e.other(a) == b and (best is None or e.capacity > best.capacity):
                best = e
        if best is None:
            raise SpecError(f"no edge between {a!r} and {b!r}")
        return best

    def add_flow(self, path: Sequence[NodeId], n_bytes: float, t: float = 0.0) -> int:
        """Register a flow of `n_bytes` along `path` starting at `t`; returns its id."""
        if not n_bytes >= 0 or not math.isfinite(n_bytes) or not t >= 0 or not math.isfinite(t):
            raise SpecError("a flow needs finite n_bytes >= 0 and start t >= 0")
        nodes = list(path)
        if len(nodes) < 1:
            raise SpecError("a flow needs a path of >= 1 node")
        links, lat = [], 0.0
        for a, b in itertools.pairwise(nodes):
            e = self._edge(a, b)
            links.append((a, b))
            self._capacity[(a, b)] = e.capacity
            lat += e.latency_s
        flow = Flow(len(self._flows), tuple(links), float(n_bytes), float(t), lat)
        self._flows.append(flow)
        return flow.id

    def capacity(self, link: DirectedLink) -> float:
        return self._capacity[link]

    def run(self) -> FlowResult:
        """Simulate every registered flow to completion."""
        pending = sorted(self._flows, key=lambda f: (f.start, f.id))
        left = {f.id: f.n_bytes for f in self._flows}
        result = FlowResult({f.id: f.start for f in self._flows}, {})
        active: list[Flow] = []
        t = pending[0].start if pending else 0.0
        nxt = 0
        while nxt < len(pending) or active:
            while nxt < len(pending) and pending[nxt].start <= t + _EPS:
                active.append(pending[nxt])
                nxt += 1
            rates = max_min_rates([f.links for f in active], self._capacity)
            for f, r in zip(active, rates, strict=True):  # zero-byte or link-less flows
                if left[f.id] <= _EPS or math.isinf(r):
                    left[f.id] = 0.0
            horizon = pending[nxt].start if nxt < len(pending) else math.inf
            ends = [t + left[f.id] / r for f, r in zip(active, rates, strict=True)
                    if r > 0 and left[f.id] > 0]
            t_next = min([horizon, *ends]) if (ends or horizon < math.inf) else t
            if any(left[f.id] <= 0 for f in active):
                t_next = t  # finished flows leave now
            if t_next > t:
                util: dict[DirectedLink, float] = {}
                for f, r in zip(active, rates, strict=True):
                    if left[f.id] > 0:
                        for lk in f.links:
                            util[lk] = util.get(lk, 0.0) + r / self._capacity[lk]
                if util:
                    result.segments.append(UtilSegment(t, t_next, util))
            still = []
            for f, r in zip(active, rates, strict=True):
                if left[f.id] > 0 and not math.isinf(r):
                    left[f.id] -= r * (t_next - t)
                if left[f.id] <= max(_EPS, f.n_bytes * 1e-12):
                    result.finish[f.id] = t_next + f.latency_s
                else:
                    still.append(f)
            active = still
            t = t_next
        return result
