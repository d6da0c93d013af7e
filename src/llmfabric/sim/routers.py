"""Router policies that spread requests over replicas, registered by name in `ROUTERS`.

All share one signature: `pick(replicas, rid, input_tokens) -> index`. Replicas have been
advanced to the arrival time, so state-based policies see the state at that instant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from llmfabric.sim.engine import Replica
from llmfabric.sim.errors import SpecError


class Router(Protocol):
    # False: the choice ignores replica state, so only the chosen replica must be advanced
    needs_state: bool

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int: ...


class RoundRobin:
    needs_state = False

    def __init__(self, seed: int = 0) -> None:
        self._next = 0

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class RandomRouter:
    needs_state = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        if not self._buf:
            self._buf = self._rng.random(4096).tolist()
        return int(self._buf.pop() * len(replicas))


class LeastOutstanding:
    """Fewest queued + running requests (ties: lowest index)."""

    needs_state = True

    def __init__(self, seed: int = 0) -> None:
        pass

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        best, best_n = 0, 1 << 60
        for i, r in enumerate(replicas):
            n = r.outstanding
            if n < best_n:
                best, best_n = i, n
        return best


class LeastWork:
    """Least estimated work: queued prompt tokens per unit speed plus running context,
    normalised by each replica's decode cost (heterogeneous-aware)."""

    needs_state = True

    def __init__(self, seed: int = 0) -> None:
        pass

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        best, best_w = 0, float("inf")
        for i, r in enumerate(replicas):
            speed = r.cost.decode_step_time(1, 0.0)
            w = (r.queued_tokens + input_tokens + r.ctx * 0.05 + 64 * len(r.running)) * speed
            if w < best_w:
                best, best_w = i, w
        return best


class PowerOfTwo:
    """Two random replicas, the one with fewer outstanding requests."""

    needs_state = True

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        a, b = self._rng.choice(n, 2, replace=False)
        return int(a if replicas[a].outstanding <= replicas[b].outstanding else b)


ROUTERS: dict[str, Callable[[int], Router]] = {
    "round_robin": RoundRobin,
    "random": RandomRouter,
    "least_outstanding": LeastOutstanding,
    "least_work": LeastWork,
    "power_of_two": PowerOfTwo,
}


def make_router(name: str, seed: int = 0) -> Router:
    try:
        return ROUTERS[name](seed)
    except KeyError:
        raise SpecError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}") from None
