"""Which TP groups form one pipeline instance: network-aware chaining (eq. 6 per instance).

Alg. 2 groups GPUs into TP groups by their latency rows; the P_pp groups of one instance
then exchange activations over the boundary links of eq. 6, and the slowest instance sets
the phase's latency. Chaining the groups in topology order (DistServe) ignores those links:
on heterogeneous links (a fabric's measured matrix, mixed NICs) it can put a 10 Gbit/s hop
inside every instance while a 100 Gbit/s pairing exists. `chain_by_links` builds the
instances greedily (each next stage: the unused group with the cheapest boundary from the
last one), then swaps same-position groups between two instances while that lowers the
pair's worse cost, and keeps whichever of this and the topology order has the lower
worst-instance cost (so it is never worse than the order it replaces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmfabric.scheduler.netplan.paths import Routes
from llmfabric.scheduler.netplan.problem import NetProblem
from llmfabric.sim.topology import NodeId

Group = list[NodeId]
MAX_SWEEPS = 5


def boundary_time(problem: NetProblem, routes: Routes, src: Sequence[NodeId],
                  dst: Sequence[NodeId], nbytes: float) -> float:
    """Eq. 6: the best sender's time to reach its slowest receiver."""
    return min(max(routes.route(a, k).time(nbytes, problem.hop_latency) for k in dst)
               for a in src)


def _cost_fn(problem: NetProblem, routes: Routes, nbytes: float
             ) -> Callable[[Sequence[Group]], float]:
    memo: dict[tuple[tuple[NodeId, ...], tuple[NodeId, ...]], float] = {}

    def hop(a: Group, b: Group) -> float:
        k = (tuple(a), tuple(b))
        if k not in memo:
            memo[k] = boundary_time(problem, routes, a, b, nbytes)
        return memo[k]

    def chain_cost(chain: Sequence[Group]) -> float:
        return sum(hop(chain[i], chain[i + 1]) for i in range(len(chain) - 1))
    return chain_cost


def chain_by_links(problem: NetProblem, groups: Sequence[Group], pp: int, nbytes: float,
                   routes: Routes) -> list[Group]:
    """`groups` (in topology order, a multiple of `pp`) reordered so that consecutive runs
    of `pp` groups are the instances with the cheapest worst boundary cost."""
    if pp < 2 or len(groups) <= pp:
        return list(groups)
    cost = _cost_fn(problem, routes, nbytes)
    n_inst = len(groups) // pp
    plain = [list(groups[i * pp:(i + 1) * pp]) for i in range(n_inst)]
    unused = list(range(len(groups)))
    greedy: list[list[Group]] = []
    for _ in range(n_inst):
        chain = [groups[unused.pop(0)]]
        while len(chain) < pp:
            best = min(unused, key=lambda j: (cost([chain[-1], groups[j]]), j))
            unused.remove(best)
            chain.append(groups[best])
        greedy.append(chain)
    for _ in range(MAX_SWEEPS):
        improved = False
        for a in range(n_inst):
            for b in range(a + 1, n_inst):
                for pos in range(pp):
                    x, y = greedy[a], greedy[b]
                    old = max(cost(x), cost(y))
                    nx, ny = list(x), list(y)
                    nx[pos], ny[pos] = y[pos], x[pos]
                    if max(cost(nx), cost(ny)) < old * (1 - 1e-9):
                        greedy[a], greedy[b] = nx, ny
                        improved = True
        if not improved:
            break
    pick = greedy if max(map(cost, greedy)) < max(map(cost, plain)) * (1 - 1e-9) else plain
    return [g for chain in pick for g in chain]
