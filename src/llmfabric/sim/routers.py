"""Router policies that spread requests over replicas, registered by name in `ROUTERS`.

All share one signature: `pick(replicas, rid, input_tokens) -> index`. Replicas have been
advanced to the arrival time, so state-based policies see the state at that instant.
A name the fabric's routing policies also use (`routing.policies.POLICIES`) means the same
policy here: random, round_robin, weighted (GPU class x count), least_outstanding (power of
two choices on outstanding requests), prefix_affinity (consistent hashing of the prefix with
bounded loads, load factor 1.25). Simulator-only: prefix_bounded_load (eps configurable),
prefix_hash (no bound), join_shortest_queue (global minimum of outstanding requests, what
`least_outstanding` meant before), least_work, power_of_two (= least_outstanding).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from llmfabric.sim.engine import Replica
from llmfabric.sim.errors import SpecError
from llmfabric.sim.gpu_names import GPU_CLASS_WEIGHTS


class Router(Protocol):
    # False: the choice ignores replica state, so only the chosen replica must be advanced
    needs_state: bool

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int: ...


class RoundRobin:
    needs_state = False

    def __init__(self, seed: int = 0, **options: object) -> None:
        self._next = 0

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class RandomRouter:
    needs_state = False

    def __init__(self, seed: int = 0, **options: object) -> None:
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        if not self._buf:
            self._buf = self._rng.random(4096).tolist()
        return int(self._buf.pop() * len(replicas))


class JoinShortestQueue:
    """Fewest queued + running requests over ALL replicas (ties: lowest index). The fabric
    has no such policy (an ingress sees only its own in-flight counts)."""

    needs_state = True

    def __init__(self, seed: int = 0, **options: object) -> None:
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

    def __init__(self, seed: int = 0, **options: object) -> None:
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
    """Power of two choices: two distinct random replicas, the one with fewer outstanding
    requests (ties: the first drawn). The fabric's `least_outstanding` policy. `probe(n)`
    draws the pair in advance, so a driver needs to bring only those two replicas up to
    date before `pick`."""

    needs_state = True

    def __init__(self, seed: int = 0, **options: object) -> None:
        self._rng = np.random.default_rng(seed)
        self._buf: list[float] = []
        self._probed: tuple[int, int] | None = None

    def probe(self, n: int) -> tuple[int, int]:
        if len(self._buf) < 2:
            self._buf = self._rng.random(8192).tolist()
        a = int(self._buf.pop() * n)
        b = int(self._buf.pop() * (n - 1))
        if b >= a:
            b += 1
        self._probed = (a, b)
        return self._probed

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        pair, self._probed = self._probed, None
        a, b = pair if pair is not None else self.probe(n)
        return a if replicas[a].outstanding <= replicas[b].outstanding else b




def replica_gpu_weight(replica: Replica,
                       table: Sequence[tuple[str, float]] = GPU_CLASS_WEIGHTS) -> float:
    """The fabric's `weighted` score: per-GPU class weight (first case-insensitive substring
    match, else 1) times the GPU count, summed over pipeline stages."""
    total = 0.0
    for st in replica.cost.deployment.stages:
        name = st.gpu.name.lower()
        per_gpu = next((w for key, w in table if key in name), 1.0)
        total += per_gpu * st.tp
    return total


class Weighted:
    """Random choice weighted by GPU class x GPU count (the fabric's `weighted` policy)."""

    needs_state = False

    def __init__(self, seed: int = 0, **options: object) -> None:
        self._rng = np.random.default_rng(seed)
        self._cum: tuple[int, np.ndarray] | None = None

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        if self._cum is None or self._cum[0] != len(replicas):
            w = np.array([replica_gpu_weight(r) for r in replicas])
            self._cum = (len(replicas), np.cumsum(w / w.sum()))
        cum = self._cum[1]
        return min(int(np.searchsorted(cum, self._rng.random(), side="right")),
                   len(replicas) - 1)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class PrefixBoundedLoad:
    """Consistent hashing of the request's prefix group onto a ring of replicas (`vnodes`
    virtual nodes each) with bounded loads (Mirrokni et al.): a replica may hold at most
    ceil((1 + eps) x (total outstanding + 1) / n) requests; past that the walk continues
    clockwise. `eps=inf` is plain consistent hashing. Requests without a prefix group go to a
    random replica (as the fabric does). Prefix groups come from `Workload.prefix_id`."""

    needs_state = True
    default_eps = 0.25

    def __init__(self, seed: int = 0, *, prefixes: Sequence[int] | None = None,
                 eps: float | None = None, vnodes: int = 64, **options: object) -> None:
        self._rng = np.random.default_rng(seed)
        self._prefixes = prefixes
        self._eps = self.default_eps if eps is None else float(eps)
        if not self._eps >= 0:
            raise SpecError("bounded-load eps must be >= 0 (inf: no bound)")
        if vnodes < 1:
            raise SpecError("vnodes must be >= 1")
        self._vnodes = vnodes
        self._ring: tuple[int, list[int], list[int]] | None = None

    def _points(self, n: int) -> tuple[list[int], list[int]]:
        if self._ring is None or self._ring[0] != n:
            pts = sorted((_hash64(f"replica{i}#{v}".encode()), i)
                         for i in range(n) for v in range(self._vnodes))
            self._ring = (n, [p for p, _ in pts], [i for _, i in pts])
        return self._ring[1], self._ring[2]

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        if self._prefixes is None or rid >= len(self._prefixes) or self._prefixes[rid] < 0:
            return int(self._rng.integers(n))
        hashes, owners = self._points(n)
        start = bisect.bisect_left(hashes, _hash64(f"prefix{self._prefixes[rid]}".encode()))
        if math.isinf(self._eps):
            return owners[start % len(owners)]
        total = sum(r.outstanding for r in replicas)
        limit = math.ceil((1.0 + self._eps) * (total + 1) / n)
        seen: set[int] = set()
        for k in range(len(owners)):
            i = owners[(start + k) % len(owners)]
            if i in seen:
                continue
            seen.add(i)
            if replicas[i].outstanding + 1 <= limit:
                return i
            if len(seen) == n:
                break
        return owners[start % len(owners)]


class PrefixAffinity(PrefixBoundedLoad):
    """The fabric's `prefix_affinity`: bounded-load consistent hashing, load factor 1.25."""

    default_eps = 0.25


class PrefixHash(PrefixBoundedLoad):
    """Plain consistent hashing of the prefix group (no load bound)."""

    default_eps = math.inf


class PrefixRemembered:
    """The fabric's `prefix_bounded` (and `cache_aware`, whose sketches in a simulation with
    one ingress say what that ingress's own memory says): a request follows the replica its
    prefix group was last sent to while that replica is under the bound
    ceil((1 + eps) x (total outstanding + 1) / n); otherwise, and for a group not seen yet,
    the least loaded replica (ties: lowest index) takes it and is remembered."""

    needs_state = True

    def __init__(self, seed: int = 0, *, prefixes: Sequence[int] | None = None,
                 eps: float = 0.25, **options: object) -> None:
        if not eps >= 0:
            raise SpecError("bounded-load eps must be >= 0 (inf: no bound)")
        self._prefixes = prefixes
        self._eps = float(eps)
        self._last: dict[int, int] = {}

    def pick(self, replicas: Sequence[Replica], rid: int, input_tokens: int) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        group = (self._prefixes[rid] if self._prefixes is not None and rid < len(self._prefixes)
                 else -1)
        total = sum(r.outstanding for r in replicas)
        limit = math.ceil((1.0 + self._eps) * (total + 1) / n)
        last = self._last.get(group) if group >= 0 else None
        if last is not None and last < n and replicas[last].outstanding + 1 <= limit:
            return last
        i = min(range(n), key=lambda k: replicas[k].outstanding)
        if group >= 0:
            self._last[group] = i
        return i


# Names shared with the fabric's routing policies (routing.policies.POLICIES) mean the same
# policy: random, round_robin, weighted, least_outstanding (power of two choices on
# outstanding requests), prefix_affinity, prefix_bounded and cache_aware (PrefixRemembered),
# session (the conversation's ring owner under the bound: prefix groups stand for
# conversations here). The rest are simulator-only.
ROUTERS: dict[str, Callable[..., Router]] = {
    "round_robin": RoundRobin,
    "random": RandomRouter,
    "weighted": Weighted,
    "least_outstanding": PowerOfTwo,
    "prefix_affinity": PrefixAffinity,
    "prefix_bounded": PrefixRemembered,
    "cache_aware": PrefixRemembered,
    "session": PrefixAffinity,
    "prefix_bounded_load": PrefixBoundedLoad,
    "prefix_hash": PrefixHash,
    "join_shortest_queue": JoinShortestQueue,
    "least_work": LeastWork,
    "power_of_two": PowerOfTwo,
}


def make_router(name: str, seed: int = 0, **options: object) -> Router:
    """A router by name; `options` go to it (prefixes=..., eps=..., vnodes=...) and are
    ignored by routers that take none."""
    try:
        factory = ROUTERS[name]
    except KeyError:
        raise SpecError(f"unknown router {name!r}; choose one of {sorted(ROUTERS)}") from None
    return factory(seed, **options)
