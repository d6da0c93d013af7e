"""All-pairs routes over a topology's GPUs AND switches (HeroServe Alg. 2, lines 2-3).

`topology.Topology` routes GPU to GPU; a network plan also needs GPU -> switch routes (INA
collection) and switch -> GPU (distribution), and the baselines need Ethernet-only routes
(DS-SwitchML/ATP do not forward over NVLink). `all_pairs(topology, n_bytes, kinds)` runs
Dijkstra (`Topology.dijkstra`, its steps filtered here) from every node on the time of an
`n_bytes` message, sum over edges of latency + n_bytes / capacity, and keeps each route's
edges, so a caller can price it with its own per-hop latency (`PathRoute.time`) and see which
directed edges it loads.

A switch whose id is a host name (`host_switch`: a measured fabric's node NIC, built by
from_fabric.py) carries no transit traffic: a route enters it only from its own GPUs or as
the first hop out of its host, and leaves it towards its GPUs only, unless it is the
source's own. Fabric nodes do not forward packets between other nodes, so a slow measured
pair must not be priced at a faster detour through a third node.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import Edge, NodeId, Topology

DirectedEdge = tuple[NodeId, NodeId]


@dataclass(frozen=True, slots=True)
class PathRoute:
    """One route: its nodes and the edges between them, in order."""

    nodes: tuple[NodeId, ...]
    edges: tuple[Edge, ...]

    @property
    def hops(self) -> int:
        return len(self.edges)

    @property
    def latency_s(self) -> float:
        return sum(e.latency_s for e in self.edges)

    @property
    def inverse_bw_sum(self) -> float:
        return sum(1.0 / e.capacity for e in self.edges)

    @property
    def bottleneck(self) -> float:
        return min((e.capacity for e in self.edges), default=math.inf)

    def directed(self) -> tuple[DirectedEdge, ...]:
        """The route's edges as (from, to) pairs: full-duplex edges load one direction."""
        return tuple(zip(self.nodes[:-1], self.nodes[1:], strict=True))

    def latency(self, hop_latency: float | None = None) -> float:
        """Path latency: the edges' own (None) or `hop_latency` per hop (0: the paper's)."""
        return self.latency_s if hop_latency is None else hop_latency * self.hops

    def time(self, n_bytes: float, hop_latency: float | None = None) -> float:
        """Store-and-forward time of `n_bytes` (HeroServe eqs. 6, 10, 15: sum of D / B_e)."""
        return self.latency(hop_latency) + n_bytes * self.inverse_bw_sum


class Routes:
    """Dijkstra routes between every two nodes of a topology (GPUs and switches)."""

    def __init__(self, topology: Topology, n_bytes: float = 1 << 20,
                 kinds: Collection[str] | None = None) -> None:
        if not n_bytes >= 0 or not math.isfinite(n_bytes):
            raise SpecError("n_bytes must be a finite number >= 0")
        self.topology = topology
        self.n_bytes = float(n_bytes)
        self.kinds = None if kinds is None else frozenset(kinds)
        self._nodes = topology.gpus() + topology.switches()
        self._order = {n: k for k, n in enumerate(self._nodes)}
        switches = set(topology.switches())
        self._no_transit = {topology.gpu(g).host for g in topology.gpus()} & switches
        self._prev: dict[NodeId, dict[NodeId, tuple[NodeId, Edge]]] = {}

    def _tree(self, src: NodeId) -> dict[NodeId, tuple[NodeId, Edge]]:
        tree = self._prev.get(src)
        if tree is not None:
            return tree
        gpus = set(self.topology.gpus())
        own = self.topology.gpu(src).host if src in gpus else src

        def allow(u: NodeId, e: Edge, v: NodeId) -> bool:
            if self.kinds is not None and e.kind not in self.kinds:
                return False
            # another node's NIC carries no transit: it only hands traffic to its own GPUs
            return not (u in self._no_transit and u != own and v not in gpus)

        best = self.topology.dijkstra(src, self.n_bytes, allow=allow, order=self._order,
                                      slack=1e-15)
        prev = {v: (u, e) for v, (_, u, e) in best.items() if u is not None and e is not None}
        self._prev[src] = prev
        return prev

    def route(self, a: NodeId, b: NodeId) -> PathRoute:
        if a not in self._order or b not in self._order:
            raise SpecError(f"no node {a!r} or {b!r} in the topology")
        if a == b:
            return PathRoute((a,), ())
        prev = self._tree(a)
        if b not in prev:
            raise SpecError(f"no path from {a!r} to {b!r} over edge kinds "
                            f"{sorted(self.kinds) if self.kinds else 'any'}")
        nodes: list[NodeId] = [b]
        edges: list[Edge] = []
        cur = b
        while cur != a:
            p, e = prev[cur]
            nodes.append(p)
            edges.append(e)
            cur = p
        return PathRoute(tuple(reversed(nodes)), tuple(reversed(edges)))

    def reachable(self, a: NodeId, b: NodeId) -> bool:
        return a == b or b in self._tree(a)


def all_pairs(topology: Topology, n_bytes: float = 1 << 20, *,
              kinds: Collection[str] | None = None, hop_latency: float | None = None
              ) -> tuple[npt.NDArray[np.float64], dict[tuple[NodeId, NodeId], PathRoute]]:
    """(D, P): D[i, j] = time of an `n_bytes` message from GPU i to GPU j (gpus() order,
    +inf when unreachable) and P[(a, b)] its route, over edges of `kinds` (None: all)."""
    routes = Routes(topology, n_bytes, kinds)
    ids = topology.gpus()
    d = np.full((len(ids), len(ids)), math.inf)
    paths: dict[tuple[NodeId, NodeId], PathRoute] = {}
    for r, a in enumerate(ids):
        d[r, r] = 0.0
        for c, b in enumerate(ids):
            if a != b and routes.reachable(a, b):
                route = routes.route(a, b)
                paths[(a, b)] = route
                d[r, c] = route.time(n_bytes, hop_latency)
    return d, paths
