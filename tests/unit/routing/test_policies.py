from __future__ import annotations

import random
from collections import Counter

import pytest

from llmfabric.routing import POLICIES, Candidate, UnknownPolicyError, candidates_for, make_policy
from llmfabric.routing.request import RouteRequest

from .conftest import make_record


def _cands(n: int = 4) -> list[Candidate]:
    return candidates_for("m", [(make_record(f"s{i}"), False) for i in range(n)])


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_picks_one_of_the_candidates(name: str) -> None:
    pol = make_policy(name, random.Random(1))
    cands = _cands()
    for i in range(50):
        c = pol.pick(cands, RouteRequest("m", prefix=f"p{i % 5}"))
        assert c in cands
        pol.on_request_start(c)
        pol.on_request_end(c, ok=True)
    assert pol.pick(cands[:1], RouteRequest("m")) == cands[0]


def test_unknown_policy_is_an_error_listing_the_choices() -> None:
    with pytest.raises(UnknownPolicyError, match="round_robin"):
        make_policy("fastest")


def test_random_is_deterministic_under_an_injected_rng() -> None:
    cands = _cands()
    a = [make_policy("random", random.Random(7)).pick(cands, RouteRequest("m")) for _ in range(1)]
    b = [make_policy("random", random.Random(7)).pick(cands, RouteRequest("m")) for _ in range(1)]
    assert a == b


def test_round_robin_cycles() -> None:
    pol = make_policy("round_robin")
    cands = _cands(3)
    got = [pol.pick(cands, RouteRequest("m")).session_id for _ in range(6)]
    assert got == ["s0", "s1", "s2", "s0", "s1", "s2"]


def test_weighted_prefers_bigger_gpus() -> None:
    recs = [(make_record("big", gpu="H100", gpu_count=8), False),
            (make_record("small", gpu="T4"), False)]
    cands = candidates_for("m", recs)
    pol = make_policy("weighted", random.Random(3))
    counts = Counter(pol.pick(cands, RouteRequest("m")).session_id for _ in range(500))
    assert counts["big"] > 10 * counts["small"]


@pytest.mark.hostile
def test_a_claimed_gpu_count_counts_up_to_a_bound_in_weighted() -> None:
    """A record may claim up to 2**20 GPUs: counted as is, one node took nearly every
    weighted pick. Past MAX_WEIGHTED_GPUS a claim adds nothing."""
    from llmfabric.routing.policies import MAX_WEIGHTED_GPUS

    recs = [(make_record("liar", gpu="H100", gpu_count=1 << 20), False),
            (make_record("honest", gpu="H100", gpu_count=MAX_WEIGHTED_GPUS), False)]
    pol = make_policy("weighted", random.Random(3))
    counts = Counter(pol.pick(candidates_for("m", recs), RouteRequest("m")).session_id
                     for _ in range(2000))
    assert 0.4 < counts["liar"] / 2000 < 0.6


def test_least_outstanding_avoids_the_busy_session() -> None:
    pol = make_policy("least_outstanding", random.Random(5))
    cands = _cands(2)
    for _ in range(3):
        pol.on_request_start(cands[0])
    assert all(pol.pick(cands, RouteRequest("m")) == cands[1] for _ in range(20))
    for _ in range(3):
        pol.on_request_end(cands[0], ok=True)
    assert {pol.pick(cands, RouteRequest("m")).session_id for _ in range(40)} == {"s0", "s1"}


def test_prefix_affinity_is_sticky_and_bounded() -> None:
    pol = make_policy("prefix_affinity", random.Random(0))
    cands = _cands(4)
    req = RouteRequest("m", prefix="You are a helpful assistant.")
    first = pol.pick(cands, req)
    assert all(pol.pick(cands, req) == first for _ in range(10))
    # Different prefixes spread over sessions.
    spread = {pol.pick(cands, RouteRequest("m", prefix=f"doc {i}")).session_id for i in range(64)}
    assert len(spread) >= 3
    # Bounded load: when the sticky session is overloaded, the next one on the ring takes it.
    for _ in range(5):
        pol.on_request_start(first)
    assert pol.pick(cands, req) != first
    # Removing another session does not move a prefix that did not live there (consistency).
    for _ in range(5):
        pol.on_request_end(first, ok=True)
    others = [c for c in cands if c != first]
    assert pol.pick([first, *others[1:]], req) == first


def _with_load(c: Candidate, **load: float) -> Candidate:
    import dataclasses

    from llmfabric.registry.records import LoadHints

    return dataclasses.replace(c, load=LoadHints(**load))  # type: ignore[arg-type]


def test_least_outstanding_reads_the_engines_queue_and_kv_pressure() -> None:
    pol = make_policy("least_outstanding", random.Random(5))
    a, b = _cands(2)
    # Equal in our own count: the engine with a queue (other ingresses' requests) loses.
    queued = [_with_load(a, queued=4, running=8, kv_usage=0.9), b]
    assert all(pol.pick(queued, RouteRequest("m")) == queued[1] for _ in range(20))
    # No queue anywhere: the fuller KV cache loses.
    kv = [_with_load(a, kv_usage=0.2), _with_load(b, kv_usage=0.7)]
    assert all(pol.pick(kv, RouteRequest("m")) == kv[0] for _ in range(20))


def test_prefix_affinity_passes_a_saturated_engine_by() -> None:
    pol = make_policy("prefix_affinity", random.Random(0))
    cands = _cands(4)
    req = RouteRequest("m", prefix="You are a helpful assistant.")
    first = pol.pick(cands, req)
    hot = [_with_load(c, queued=3, kv_usage=0.97) if c == first else c for c in cands]
    assert pol.pick(hot, req).session_id != first.session_id
    warm = [_with_load(c, queued=0, kv_usage=0.97) if c == first else c for c in cands]
    assert pol.pick(warm, req).session_id == first.session_id  # full but not queueing: stay
