"""Load-balancing policies: one Protocol, registered by name in an explicit dict.

Every policy gets an injected `random.Random`, so tests are deterministic. `pick` never sees an
empty sequence (the Router checks) and returns one of the candidates given.

- random: uniform choice (the paper's default; cheap).
- round_robin: cycles through the candidates in session-id order.
- weighted: random weighted by GPU class (and GPU count).
- least_outstanding: power of two choices on this ingress's in-flight count per session.
- prefix_affinity: consistent hashing of the prompt prefix (so engines' prefix caches hit),
  with a bounded-load fallback to the next session on the ring.
- prefix_bounded, session, cache_aware: block-level prefix, conversation and gossiped
  cache-sketch affinity under a (1 + eps) x average bound (routing/prefix.py).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from llmfabric.routing.candidates import Candidate
from llmfabric.routing.errors import UnknownPolicyError
from llmfabric.routing.prefix import CacheAwarePolicy, PrefixBoundedPolicy, SessionAffinityPolicy
from llmfabric.routing.request import RouteRequest
from llmfabric.sim.gpu_names import GPU_CLASS_WEIGHTS


class Policy(Protocol):
    name: str
    needs_prefix: bool  # whether the ingress must extract the prompt prefix for this policy

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate: ...

    def on_request_start(self, candidate: Candidate) -> None: ...

    def on_request_end(self, candidate: Candidate, ok: bool) -> None: ...


class _Outstanding:
    """In-flight requests per session id, as seen by this ingress."""

    def __init__(self) -> None:
        self.outstanding: dict[str, int] = {}

    def on_request_start(self, candidate: Candidate) -> None:
        sid = candidate.session_id
        self.outstanding[sid] = self.outstanding.get(sid, 0) + 1

    def on_request_end(self, candidate: Candidate, ok: bool) -> None:
        sid = candidate.session_id
        n = self.outstanding.get(sid, 0) - 1
        if n > 0:
            self.outstanding[sid] = n
        else:
            self.outstanding.pop(sid, None)


class RandomPolicy:
    name = "random"
    needs_prefix = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        if len(candidates) == 1:
            return candidates[0]
        return candidates[self._rng.randrange(len(candidates))]

    def on_request_start(self, candidate: Candidate) -> None:
        return None

    def on_request_end(self, candidate: Candidate, ok: bool) -> None:
        return None


class RoundRobinPolicy:
    name = "round_robin"
    needs_prefix = False

    def __init__(self, rng: random.Random) -> None:
        self._next: dict[str, int] = {}  # model -> counter

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        ordered = sorted(candidates, key=lambda c: c.session_id)
        i = self._next.get(request.model, 0)
        self._next[request.model] = i + 1
        return ordered[i % len(ordered)]

    def on_request_start(self, candidate: Candidate) -> None:
        return None

    def on_request_end(self, candidate: Candidate, ok: bool) -> None:
        return None


# Relative capability of GPU classes (sim.gpu_names: one table for routing and the simulator).
DEFAULT_GPU_WEIGHTS = GPU_CLASS_WEIGHTS
# GPUs one engine counts with at most: a node's count is its own claim (the record accepts
# up to 2**20), and one claiming a million GPUs took 9,999 of 10,000 weighted picks.
MAX_WEIGHTED_GPUS = 16


def gpu_weight(candidate: Candidate, table: Sequence[tuple[str, float]]) -> float:
    g = candidate.hardware.gpu_model.lower()
    per_gpu = 1.0
    for key, w in table:
        if key in g:
            per_gpu = w
            break
    return per_gpu * min(MAX_WEIGHTED_GPUS, max(1, candidate.hardware.gpu_count))


class WeightedPolicy:
    name = "weighted"
    needs_prefix = False

    def __init__(
        self, rng: random.Random, weights: Sequence[tuple[str, float]] = DEFAULT_GPU_WEIGHTS
    ) -> None:
        self._rng = rng
        self._table = tuple((k.lower(), w) for k, w in weights)

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        weights = [gpu_weight(c, self._table) for c in candidates]
        return self._rng.choices(list(candidates), weights=weights, k=1)[0]

    def on_request_start(self, candidate: Candidate) -> None:
        return None

    def on_request_end(self, candidate: Candidate, ok: bool) -> None:
        return None


class LeastOutstandingPolicy(_Outstanding):
    """Power of two choices: sample two sessions, send to the one with fewer in flight."""

    name = "least_outstanding"
    needs_prefix = False

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self._rng = rng

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(range(len(candidates)), 2)
        ca, cb = candidates[a], candidates[b]
        return ca if self._pressure(ca) <= self._pressure(cb) else cb

    def _pressure(self, c: Candidate) -> tuple[int, float, int]:
        """Ours in flight + requests waiting in the engine's own queue (other ingresses'
        too, from its metrics), then its KV-cache use, then what it runs."""
        load = c.load
        return (self.outstanding.get(c.session_id, 0) + load.queued, load.kv_usage,
                load.inflight + load.running)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


# An engine that queues requests while its KV cache is (nearly) full gains nothing from a
# prefix hit: the request would wait for memory. The prefix walk passes it by.
SATURATED_KV = 0.95


def saturated(c: Candidate) -> bool:
    return c.load.queued > 0 and c.load.kv_usage >= SATURATED_KV


class PrefixAffinityPolicy(_Outstanding):
    """Consistent hashing of the prompt prefix onto a ring of sessions (virtual nodes).

    Bounded load (consistent hashing with bounded loads): a session may take at most
    ceil(load_factor * (total_in_flight + 1) / n) requests; past that the walk continues
    clockwise to the next session on the ring.
    """

    name = "prefix_affinity"
    needs_prefix = True

    def __init__(
        self, rng: random.Random, vnodes: int = 64, load_factor: float = 1.25, max_rings: int = 64
    ) -> None:
        super().__init__()
        self._rng = rng
        self._vnodes = vnodes
        self._load_factor = load_factor
        self._max_rings = max_rings
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def _ring(self, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
        ring = self._rings.get(ids)
        if ring is None:
            points = sorted(
                (_hash64(f"{sid}#{v}".encode()), sid) for sid in ids for v in range(self._vnodes)
            )
            ring = ([p for p, _ in points], [s for _, s in points])
            if len(self._rings) >= self._max_rings:
                self._rings.clear()
            self._rings[ids] = ring
        return ring

    def pick(self, candidates: Sequence[Candidate], request: RouteRequest) -> Candidate:
        if len(candidates) == 1:
            return candidates[0]
        by_id = {c.session_id: c for c in candidates}
        if not request.prefix:
            return candidates[self._rng.randrange(len(candidates))]
        hashes, owners = self._ring(tuple(sorted(by_id)))
        total = sum(self.outstanding.get(sid, 0) for sid in by_id)
        limit = math.ceil(self._load_factor * (total + 1) / len(by_id))
        start = bisect.bisect_left(hashes, _hash64(request.prefix.encode()))
        seen: set[str] = set()
        for i in range(len(owners)):
            sid = owners[(start + i) % len(owners)]
            if sid in seen:
                continue
            seen.add(sid)
            if self.outstanding.get(sid, 0) + 1 <= limit and not saturated(by_id[sid]):
                return by_id[sid]
            if len(seen) == len(by_id):
                break
        return by_id[owners[start % len(owners)]]


PolicyFactory = Callable[[random.Random], Policy]

POLICIES: Mapping[str, PolicyFactory] = {
    "random": RandomPolicy,
    "round_robin": RoundRobinPolicy,
    "weighted": WeightedPolicy,
    "least_outstanding": LeastOutstandingPolicy,
    "prefix_affinity": PrefixAffinityPolicy,
    "prefix_bounded": PrefixBoundedPolicy,
    "session": SessionAffinityPolicy,
    "cache_aware": CacheAwarePolicy,
}

DEFAULT_POLICY = "random"


def make_policy(name: str = DEFAULT_POLICY, rng: random.Random | None = None) -> Policy:
    factory = POLICIES.get(name)
    if factory is None:
        raise UnknownPolicyError(
            f"unknown routing policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}"
        )
    return factory(rng if rng is not None else random.Random())
