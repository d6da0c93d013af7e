"""HeroServe's load-aware online scheduler (§III-D, eqs. 16-18).

A `Policy` is one way a TP group can all-reduce: INA via a switch, or a ring, with the
directed links it loads and its bottleneck capacity. Every member GPU keeps a
`PolicyTable` for its group:

- J(c, D) = b_c + delta_c(D), delta_c = D / (T_u x Cap_c)   (eq. 16; the printed
  D / (T_u b_c) divides bytes by a utilisation, COMPANIONS §3.5: Cap_c = c's bottleneck)
- choose(D) = argmin_c J(c, D), ties by policy id, so members with equal tables agree
- apply(c*, D): b_c* += delta_c*; b_c += delta_c x f(c*, c) for the others   (eq. 17)
- update_penalties(load): f(c*, c) <- (1 - gamma) f + gamma W(c*, c),
  W = sum_{e in c* ∩ c} B(e) / sum_{e in c} B(e) with B(e) the measured load   (eq. 18)
- decay(dt): b_c <- b_c exp(-dt / T_u) between measurements; reset(util) sets b_c to the
  measured max utilisation over c's links.

`Controller.sync(selections)` applies a round's selections to every member's table in one
order (the broadcast of eq. 17), so the tables stay equal and the next choice agrees without
an extra round. `candidate_policies` builds a group's rows from the topology.
`run_rounds` is the Fig. 9-style experiment: several TP groups all-reduce at once, round
after round, on `sim.netsim.FlowSim`, each with a fixed policy or with its table (reset from
the other groups' load: last round's measured utilisation of those still to pick, plus the
expected delta of this round's earlier picks; then eq. 16).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmfabric.scheduler.netplan.commcost import ring_order
from llmfabric.scheduler.netplan.paths import DirectedEdge, Routes
from llmfabric.sim.errors import SpecError
from llmfabric.sim.netsim import FlowSim
from llmfabric.sim.topology import NodeId, Topology

GAMMA = 0.3
T_U = 10e-3


@dataclass(frozen=True, slots=True)
class Policy:
    id: int
    scheme: str  # "ina" | "ring"
    switch: NodeId | None
    links: frozenset[DirectedEdge]
    capacity: float  # bottleneck bytes/s
    paths: tuple[tuple[NodeId, ...], ...]  # one flow path per member (INA: up then down)

    @property
    def name(self) -> str:
        return f"ina@{self.switch}" if self.scheme == "ina" else f"ring#{self.id}"


def _policy(pid: int, scheme: str, switch: NodeId | None, routes: Sequence[Sequence[NodeId]],
            topology: Topology) -> Policy:
    links: set[DirectedEdge] = set()
    cap = math.inf
    for nodes in routes:
        for a, b in itertools.pairwise(nodes):
            links.add((a, b))
            cap = min(cap, max(e.capacity for e in topology.neighbours(a) if e.other(a) == b))
    return Policy(pid, scheme, switch, frozenset(links), cap,
                  tuple(tuple(n) for n in routes))


def candidate_policies(topology: Topology, group: Sequence[NodeId],
                       kinds: Iterable[Iterable[str] | None] = (None, ("ethernet",))
                       ) -> list[Policy]:
    """A group's rows: INA via every switch with aggregator slots that all members reach,
    and a ring, each over the routes of every edge-kind set in `kinds` (None: all kinds,
    NVLink forwarding allowed; ("ethernet",): Ethernet only); duplicates dropped."""
    if len(group) < 2:
        raise SpecError("a policy table needs a group of >= 2 GPUs")
    out: list[Policy] = []
    seen: set[tuple[str, NodeId | None, frozenset[DirectedEdge]]] = set()
    order = ring_order(topology, group)
    for kind in kinds:
        routes = Routes(topology, 1 << 20, None if kind is None else frozenset(kind))
        ring = [routes.route(order[k], order[(k + 1) % len(order)]).nodes
                for k in range(len(order))]
        options: list[tuple[str, NodeId | None, list[tuple[NodeId, ...]]]] = [
            ("ring", None, ring)]
        for s in topology.switches():
            if topology.switch(s).aggregator_slots < 1:
                continue
            if all(routes.reachable(g, s) for g in group):
                paths = [routes.route(g, s).nodes for g in group]
                paths += [routes.route(s, g).nodes for g in group]
                options.append(("ina", s, paths))
        for scheme, switch, paths in options:
            p = _policy(len(out), scheme, switch, paths, topology)
            sig = (scheme, switch, p.links)
            if sig not in seen:
                seen.add(sig)
                out.append(p)
    return out


class PolicyTable:
    """One member's policy-cost table (see the module docstring)."""

    def __init__(self, group: Sequence[NodeId], candidates: Sequence[Policy],
                 gamma: float = GAMMA, t_u: float = T_U) -> None:
        if not candidates:
            raise SpecError("a policy table needs >= 1 candidate policy")
        if not 0 <= gamma <= 1 or not t_u > 0:
            raise SpecError("need 0 <= gamma <= 1 and t_u > 0")
        ids = [c.id for c in candidates]
        if len(set(ids)) != len(ids):
            raise SpecError("policy ids must be unique")
        self.group = tuple(group)
        self.policies = sorted(candidates, key=lambda c: c.id)
        self.gamma, self.t_u = gamma, t_u
        self.b: dict[int, float] = {c.id: 0.0 for c in self.policies}
        # f starts at the structural sharing ratio (capacities as B(e))
        self.f: dict[tuple[int, int], float] = {}
        for a in self.policies:
            for c in self.policies:
                if a.id != c.id:
                    self.f[(a.id, c.id)] = _sharing(a, c, None)

    def delta(self, policy: Policy, n_bytes: float) -> float:
        return n_bytes / (self.t_u * policy.capacity)

    def cost(self, policy: Policy, n_bytes: float) -> float:
        """J(c, D) = b_c + delta_c (eq. 16)."""
        return self.b[policy.id] + self.delta(policy, n_bytes)

    def choose(self, n_bytes: float) -> Policy:
        """The cheapest policy for an all-reduce of `n_bytes` (ties: lowest id)."""
        if not n_bytes >= 0:
            raise SpecError("n_bytes must be >= 0")
        return min(self.policies, key=lambda c: (self.cost(c, n_bytes), c.id))

    def apply(self, chosen: int, n_bytes: float) -> None:
        """Eq. 17 after `chosen` carried `n_bytes`."""
        if chosen not in self.b:
            raise SpecError(f"no policy {chosen} in this table")
        for c in self.policies:
            d = self.delta(c, n_bytes)
            self.b[c.id] += d if c.id == chosen else d * self.f[(chosen, c.id)]

    def update_penalties(self, load: Mapping[DirectedEdge, float]) -> None:
        """Eq. 18 with the measured per-link load B(e) (bytes/s or utilisation)."""
        for (a, c), old in self.f.items():
            w = _sharing(self._by_id(a), self._by_id(c), load)
            self.f[(a, c)] = (1 - self.gamma) * old + self.gamma * w

    def decay(self, dt: float) -> None:
        if dt < 0:
            raise SpecError("dt must be >= 0")
        k = math.exp(-dt / self.t_u)
        for cid in self.b:
            self.b[cid] *= k

    def reset(self, utilisation: Mapping[DirectedEdge, float]) -> None:
        """b_c <- the measured max utilisation over c's links."""
        for c in self.policies:
            self.b[c.id] = max((utilisation.get(e, 0.0) for e in c.links), default=0.0)

    def _by_id(self, pid: int) -> Policy:
        for c in self.policies:
            if c.id == pid:
                return c
        raise SpecError(f"no policy {pid}")

    def state(self) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[tuple[int, int], float],
                                                                  ...]]:
        return tuple(sorted(self.b.items())), tuple(sorted(self.f.items()))


def _sharing(chosen: Policy, other: Policy, load: Mapping[DirectedEdge, float] | None
             ) -> float:
    """W(c*, c): the load on c's links that c* shares, over all of c's load."""
    def weight(e: DirectedEdge) -> float:
        return 1.0 if load is None else float(load.get(e, 0.0))

    total = sum(weight(e) for e in other.links)
    if total <= 0:
        return 0.0
    return sum(weight(e) for e in chosen.links & other.links) / total


class Controller:
    """Broadcasts each round's selections to every member table of a group."""

    def __init__(self, tables: Sequence[PolicyTable]) -> None:
        if not tables:
            raise SpecError("a controller needs >= 1 table")
        self.tables = list(tables)

    def sync(self, selections: Sequence[tuple[int, float]]) -> None:
        """Apply (policy id, bytes) selections, in order, to every table (eq. 17)."""
        for pid, n_bytes in selections:
            for t in self.tables:
                t.apply(pid, n_bytes)


def _flows(policy: Policy, n_members: int, n_bytes: float) -> list[tuple[tuple[NodeId, ...],
                                                                          float]]:
    """The flows of one all-reduce: ring hops carry 2(P-1)/P x D each; INA members send D
    up and receive D down."""
    if policy.scheme == "ring":
        share = 2.0 * (n_members - 1) / n_members * n_bytes
        return [(p, share) for p in policy.paths]
    return [(p, n_bytes) for p in policy.paths]


@dataclass(frozen=True, slots=True)
class RoundsResult:
    mean_s: float  # mean all-reduce time over groups and rounds
    per_round: tuple[float, ...]  # slowest group per round
    choices: tuple[tuple[str, ...], ...]  # policy name per group per round


def run_rounds(topology: Topology, groups: Sequence[Sequence[NodeId]], n_bytes: float,
               rounds: int = 10, *, online: bool = True,
               static: Sequence[int] | None = None) -> RoundsResult:
    """Every group all-reduces `n_bytes` at the start of each round (rounds do not overlap).
    online=False: each group keeps policy `static[g]` (default: its cheapest on an idle
    network, eq. 16 with b = 0)."""
    if rounds < 1 or not groups:
        raise SpecError("run_rounds needs >= 1 round and >= 1 group")
    tables = [PolicyTable(g, candidate_policies(topology, g)) for g in groups]
    fixed = [t.policies[static[k]] if static is not None else t.choose(n_bytes)
             for k, t in enumerate(tables)]
    times: list[float] = []
    worst: list[float] = []
    choices: list[tuple[str, ...]] = []
    # each group's link utilisation in the last round (its bytes over the round's span)
    last: list[dict[DirectedEdge, float]] = [{} for _ in groups]
    for _ in range(rounds):
        picks: list[Policy] = []
        for k, t in enumerate(tables):
            if online:
                # the load this group will share links with: groups still to pick, as
                # measured last round, plus the expected delta of this round's earlier picks
                # (the controller's broadcast reaching groups that share links); its own
                # last round is over and does not count
                util: dict[DirectedEdge, float] = {}
                for other in range(k + 1, len(groups)):
                    for e, u in last[other].items():
                        util[e] = util.get(e, 0.0) + u
                for other, prev in enumerate(picks):
                    extra = tables[other].delta(prev, n_bytes)
                    for e in prev.links:
                        util[e] = util.get(e, 0.0) + extra
                t.reset(util)
                pick = t.choose(n_bytes)
                t.apply(pick.id, n_bytes)
            else:
                pick = fixed[k]
            picks.append(pick)
        sim = FlowSim(topology)
        flows = [_flows(pick, len(g), n_bytes) for pick, g in zip(picks, groups, strict=True)]
        ids = [[sim.add_flow(p, b, 0.0) for p, b in fl] for fl in flows]
        res = sim.run()
        per_group = [max(res.finish[i] for i in fl) for fl in ids]
        times.extend(per_group)
        worst.append(max(per_group))
        choices.append(tuple(p.name for p in picks))
        span = max(per_group)
        for k, fl in enumerate(flows):
            load: dict[DirectedEdge, float] = {}
            if span > 0:
                for path, b in fl:
                    for e in itertools.pairwise(path):
                        load[e] = load.get(e, 0.0) + b / (sim.capacity(e) * span)
            last[k] = load
    return RoundsResult(sum(times) / len(times), tuple(worst), tuple(choices))
