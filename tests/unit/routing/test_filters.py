from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.registry.records import ServedModel
from llmfabric.routing import (
    InvalidConstraintError,
    Router,
    candidates_for,
    eligible,
    make_policy,
    route_request,
    trust_filter,
)
from llmfabric.routing.router import NoRoute, NoRouteReason, RouteDecision

from .conftest import make_record

providers = st.sampled_from(["a", "b", "c", "d", "e"])


@given(
    nodes=st.lists(providers, min_size=0, max_size=12),
    allow=st.one_of(st.none(), st.frozensets(providers)),
    body_allow=st.one_of(st.none(), st.lists(providers)),
)
def test_trust_filter_never_admits_a_provider_outside_the_allowlist(
    nodes: list[str], allow: frozenset[str] | None, body_allow: list[str] | None
) -> None:
    recs = [(make_record(f"s{i}", provider=p), False) for i, p in enumerate(nodes)]
    cands = candidates_for("m", recs)
    header = ",".join(sorted(allow)) if allow is not None else None
    meta = {"providers": body_allow} if body_allow is not None else None
    req = route_request("m", providers_header=header, metadata=meta)
    kept = eligible(cands, req)
    for c in kept:
        if allow is not None:
            assert c.provider_id in allow
        if body_allow is not None:
            assert c.provider_id in body_allow
    # And the router never picks outside it, whatever was tried before.
    router = Router(make_policy("random"))
    for _ in range(3):
        d = router.route(req, cands)
        if isinstance(d, RouteDecision):
            assert c_ok(d.candidate.provider_id, allow, body_allow)
    if allow is None and body_allow is None:
        assert len(kept) == len(cands)
    else:
        assert trust_filter(cands, frozenset()) == []


def c_ok(p: str, allow: frozenset[str] | None, body: list[str] | None) -> bool:
    return (allow is None or p in allow) and (body is None or p in body)


def test_qos_filters() -> None:
    recs = [
        (make_record("q4", models=(ServedModel("m", quant_bits=4, max_context=32768),)), False),
        (make_record("a100", gpu="A100-80GB", models=(ServedModel("m", max_context=8192),)), False),
        (make_record("h100", gpu="H100-SXM", models=(ServedModel("m", max_context=4096),)), False),
    ]
    cands = candidates_for("m", recs)

    def ids(meta: dict[str, object]) -> list[str]:
        return sorted(c.session_id for c in eligible(cands, route_request("m", metadata=meta)))

    assert ids({"min_quant_bits": 8}) == ["a100", "h100"]
    assert ids({"min_quant_bits": "8", "gpu": "a100"}) == ["a100"]
    assert ids({"gpu": ["h100", "A100"]}) == ["a100", "h100", "q4"]
    assert ids({"min_context": 8000}) == ["a100", "q4"]
    with pytest.raises(InvalidConstraintError):
        route_request("m", metadata={"min_context": "lots"})
    with pytest.raises(InvalidConstraintError):
        route_request("m", metadata={"providers": 7})


def test_router_reports_why_there_is_no_route() -> None:
    router = Router(make_policy("random"))
    req = route_request("m", providers_header="nobody")
    assert router.route(req, []) == NoRoute(NoRouteReason.NO_CANDIDATES, 0, 0)
    cands = candidates_for("m", [(make_record("a"), False), (make_record("b"), False)])
    filtered = router.route(req, cands)
    assert isinstance(filtered, NoRoute) and filtered.reason == "filtered"
    open_req = route_request("m")
    exhausted = router.route(open_req, cands, tried={"a", "b"})
    assert isinstance(exhausted, NoRoute) and exhausted.reason == "exhausted"
    retry = router.route(open_req, cands, tried={"a"}, attempt=1)
    assert isinstance(retry, RouteDecision) and retry.candidate.session_id == "b"
    assert retry.attempt == 1 and "retry later" in exhausted.message("m")
