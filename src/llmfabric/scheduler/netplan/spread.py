"""HeroServe's INA member routes: NVLink forwarding to the least-loaded NIC.

What the paper states: a GPU may "use NVLink to forward data to an access switch S2 before
traversing an Ethernet link" (§II, Fig. 2(b)); a policy is "the transmission scheme ..., the
next hop, the transmission path", its cost "the maximum bandwidth utilization ratio among all
transmission links involved", each GPU "selects the lowest-cost policy" and the choice raises
the cost of the links it loads for the next one (§III-D, eqs. 16-17), so that traffic is
spread "evenly ... across the heterogeneous network" (§V-B, Fig. 10's text). COMPANIONS §3.6:
HeroServe uses "NVLink forwarding to the least-loaded NIC"; the baselines forward over
Ethernet only.

Why it matters: Dijkstra routes each member alone, so every member whose own NIC is on
another switch forwards through the same (lowest-id) server mate: in a TP16 group over two
2tracks servers, five members' bytes leave through one NIC.

`spread_routes`: members pick in turn, the cheapest alone first (then topology order); each
takes the candidate whose most shared edge is least shared once it is added (max over the
route's directed edges of (n_e + 1) / C_e: the eq. 16 cost with one more member's bytes),
ties by the summed (n_e + 1) / C_e (the member's store-and-forward time per byte), then its
own Dijkstra route before a detour, then the mate's topology order. Candidates: the
member's Dijkstra route, and one NVLink hop to each server mate followed by the mate's
Dijkstra route (one that does not come back through the member). Routes down from the switch
are the routes up reversed (full-duplex links; `down_routes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from weakref import WeakKeyDictionary

from llmfabric.scheduler.netplan.paths import DirectedEdge, PathRoute, Routes
from llmfabric.sim.errors import SpecError
from llmfabric.sim.topology import NodeId, Topology

NVLINK = "nvlink"
# a route with its directed edges and their capacities (bytes/s), as `_key` reads them
Candidate = tuple[PathRoute, tuple[tuple[DirectedEdge, float], ...]]
# per Routes object: (member, switch) -> its candidates (planning asks again and again)
_CACHE: WeakKeyDictionary[Routes, dict[tuple[NodeId, NodeId], list[Candidate]]] = (
    WeakKeyDictionary()
)


def _candidates(topology: Topology, g: NodeId, switch: NodeId, routes: Routes) -> list[Candidate]:
    cache = _CACHE.setdefault(routes, {})
    hit = cache.get((g, switch))
    if hit is None:
        hit = cache[(g, switch)] = [
            (r, tuple(zip(r.directed(), (e.capacity for e in r.edges), strict=True)))
            for r in _routes(topology, g, switch, routes)
        ]
    return hit


def _routes(topology: Topology, g: NodeId, switch: NodeId, routes: Routes) -> list[PathRoute]:
    """The member's Dijkstra route, then one NVLink hop to each server mate (topology
    order) followed by the mate's Dijkstra route, where it does not come back through g."""
    out = [routes.route(g, switch)]
    if routes.kinds is not None and NVLINK not in routes.kinds:
        return out
    host = topology.gpu(g).host
    index = {n: k for k, n in enumerate(topology.gpus())}
    mates = sorted(
        (
            e
            for e in topology.neighbours(g)
            if e.kind == NVLINK and e.other(g) in index and topology.gpu(e.other(g)).host == host
        ),
        key=lambda e: index[e.other(g)],
    )
    for e in mates:
        m = e.other(g)
        if not routes.reachable(m, switch):
            continue
        rest = routes.route(m, switch)
        if g in rest.nodes:
            continue
        out.append(PathRoute((g, *rest.nodes), (e, *rest.edges)))
    return out


def _pick(cands: list[Candidate], load: dict[DirectedEdge, int]) -> int:
    """The candidate with the least (max, sum) of (n_e + 1) / C_e; ties: the earlier."""
    best, best_key = 0, (math.inf, math.inf)
    for i, (_, edges) in enumerate(cands):
        top = total = 0.0
        for d, cap in edges:
            share = (load.get(d, 0) + 1) / cap
            total += share
            top = max(top, share)
        if (top, total) < best_key:
            best, best_key = i, (top, total)
    return best


def spread_routes(
    topology: Topology, group: Sequence[NodeId], switch: NodeId, routes: Routes
) -> list[PathRoute]:
    """Each member's route up to `switch` (in `group`'s order), NVLink forwarding to the
    least-loaded NIC (module docstring)."""
    members = list(group)
    if not members or len(set(members)) != len(members):
        raise SpecError("a TP group needs >= 1 distinct GPU")
    topology.switch(switch)
    if routes.topology is not topology:
        raise SpecError("routes were computed on another topology")
    cands = [_candidates(topology, g, switch, routes) for g in members]
    order = sorted(
        range(len(members)),
        key=lambda k: (cands[k][0][0].inverse_bw_sum, cands[k][0][0].latency_s, k),
    )
    load: dict[DirectedEdge, int] = {}
    chosen: list[PathRoute | None] = [None] * len(members)
    for k in order:
        route, edges = cands[k][_pick(cands[k], load)]
        chosen[k] = route
        for d, _ in edges:
            load[d] = load.get(d, 0) + 1
    return [r for r in chosen if r is not None]


def reverse(route: PathRoute) -> PathRoute:
    return PathRoute(tuple(reversed(route.nodes)), tuple(reversed(route.edges)))


def down_routes(up: Sequence[PathRoute]) -> list[PathRoute]:
    """The switch's routes back to the members: the routes up, reversed."""
    return [reverse(r) for r in up]
