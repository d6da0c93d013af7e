"""Suspected candidates are a fallback (routing.router): unsuspected ones first, suspected
ones only when no unsuspected candidate is eligible, and never past the trust filter. Before
this, a request whose every candidate was briefly suspected got 503 "no node is serving"."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.routing import (
    NoRoute,
    RouteDecision,
    Router,
    candidates_for,
    make_policy,
    route_request,
)
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.index import CandidateIndex

from .conftest import make_record


def _cands(suspected: dict[str, bool], provider: str = "p1") -> list[Candidate]:
    return candidates_for("m", [(make_record(s, provider=provider), v)
                                for s, v in suspected.items()])


def test_every_candidate_suspected_still_routes_instead_of_503() -> None:
    router = Router(make_policy("round_robin"))
    cands = _cands({"a": True, "b": True})
    d = router.route(route_request("m"), cands)
    assert isinstance(d, RouteDecision) and d.candidate.suspected
    # the retry after a failure moves on to the other suspected candidate, then gives up
    again = router.route(route_request("m"), cands, tried={d.candidate.session_id}, attempt=1)
    assert isinstance(again, RouteDecision)
    assert again.candidate.session_id != d.candidate.session_id
    done = router.route(route_request("m"), cands, tried={"a", "b"}, attempt=2)
    assert isinstance(done, NoRoute) and done.reason == "exhausted"


def test_the_index_keeps_a_suspected_session_as_a_flagged_candidate() -> None:
    index = CandidateIndex()
    rec = make_record("a")
    index.update("a", rec, suspected=True)
    assert [(c.session_id, c.suspected) for c in index.candidates("m")] == [("a", True)]
    index.update("a", rec, suspected=False)  # refuted
    assert [(c.session_id, c.suspected) for c in index.candidates("m")] == [("a", False)]


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.booleans(), min_size=1),
       st.sampled_from(["random", "round_robin", "least_outstanding", "weighted"]),
       st.integers(0, 2**16))
def test_unsuspected_candidates_are_always_preferred(
        suspected: dict[str, bool], policy: str, seed: int) -> None:
    router = Router(make_policy(policy, random.Random(seed)))
    cands = _cands(suspected)
    tried: set[str] = set()
    order = []
    while True:  # retries walk every candidate, all unsuspected ones first
        d = router.route(route_request("m"), cands, tried, len(tried))
        if isinstance(d, NoRoute):
            break
        order.append(d.candidate.suspected)
        tried.add(d.candidate.session_id)
    assert tried == set(suspected)
    assert order == sorted(order)  # False (unsuspected) before True


def test_the_fallback_never_crosses_the_allowlist() -> None:
    router = Router(make_policy("random", random.Random(1)))
    cands = [*_cands({"a": False}, provider="other"), *_cands({"b": True}, provider="mine")]
    d = router.route(route_request("m", providers_header="mine"), cands)
    assert isinstance(d, RouteDecision) and d.candidate.session_id == "b"
    nobody = router.route(route_request("m", providers_header="nobody"), cands)
    assert isinstance(nobody, NoRoute) and nobody.reason == "filtered"
