from __future__ import annotations

import random

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
)
from llmfabric.routing.router import NoRoute, NoRouteReason, RouteDecision
from llmfabric.sim.gpu_names import gpu_matches, gpu_name
from llmfabric.sim.hardware import BUILTIN_GPUS

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
    # The filter keeps exactly the allowed candidates: nothing outside, nothing allowed lost.
    assert [c.session_id for c in kept] == [
        c.session_id for c in cands if c_ok(c.provider_id, allow, body_allow)
    ]
    # And the router never picks outside it, first try or retry, and retries reach every
    # allowed candidate before giving up.
    router = Router(make_policy("random", random.Random(len(nodes))))
    tried: list[str] = []
    for attempt in range(len(cands) + 1):
        d = router.route(req, cands, tried, attempt)
        if isinstance(d, NoRoute):
            break
        assert c_ok(d.candidate.provider_id, allow, body_allow)
        assert d.candidate.session_id not in tried
        tried.append(d.candidate.session_id)
    assert sorted(tried) == sorted(c.session_id for c in kept)


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


# ---- metadata.gpu: exact catalog name or family token, never a substring -------------------

CATALOG = [s.name for s in BUILTIN_GPUS]
UNKNOWN = ["T4", "L4", "A10", "H20", "Tesla-T4", "B200"]
NODE_GPUS = CATALOG + UNKNOWN


def spellings(name: str) -> st.SearchStrategy[str]:
    """The same name as users and drivers write it: case, separators, vendor prefix."""
    def variant(t: tuple[str, str, str]) -> str:
        case, sep, vendor = t
        text = name.replace("-", sep)
        text = text.upper() if case == "u" else text.lower() if case == "l" else text
        return vendor + text
    return st.tuples(st.sampled_from("ulk"), st.sampled_from(["-", " ", "_"]),
                     st.sampled_from(["", "NVIDIA ", "nvidia-"])).map(variant)


def admitted(wanted: str, gpus: list[str]) -> set[str]:
    recs = [(make_record(f"n{i}", gpu=g), False) for i, g in enumerate(gpus)]
    req = route_request("m", metadata={"gpu": wanted})
    return {c.hardware.gpu_model for c in eligible(candidates_for("m", recs), req)}


@given(target=st.sampled_from(CATALOG), data=st.data())
def test_a_catalog_name_admits_that_gpu_only_however_it_is_spelled(
    target: str, data: st.DataObject
) -> None:
    wanted = data.draw(spellings(target))
    # Exact names are exact (H200 never admits GH200, L40 never L40S, A100-40GB never
    # A100-80GB) unless the name is also a family token, which admits only that family.
    got = admitted(wanted, NODE_GPUS)
    assert target in got
    for other in got - {target}:
        assert gpu_name(other).family == gpu_name(target).key == gpu_name(wanted).family


@given(node=st.sampled_from(NODE_GPUS), data=st.data())
def test_family_tokens_admit_exactly_their_family(node: str, data: st.DataObject) -> None:
    family = gpu_name(node).family
    got = admitted(data.draw(spellings(family)), NODE_GPUS)
    assert node in got
    assert {g for g in NODE_GPUS if gpu_name(g).family == family} <= got
    for g in got:  # anything else admitted is the catalog GPU the token also names
        assert gpu_name(g).family == family or gpu_name(g).key == gpu_name(family).key


@given(node=st.sampled_from(NODE_GPUS), wanted=st.sampled_from(NODE_GPUS), data=st.data())
def test_gpu_matching_ignores_spelling_on_both_sides(
    node: str, wanted: str, data: st.DataObject
) -> None:
    node_spelled = data.draw(spellings(node))
    want_spelled = data.draw(spellings(wanted))
    assert gpu_matches(node_spelled, (want_spelled,)) == gpu_matches(node, (wanted,))


def test_gpu_matching_examples() -> None:
    assert admitted("H200", NODE_GPUS) == {"H200"}
    assert admitted("L40", NODE_GPUS) == {"L40"}
    assert admitted("A10", NODE_GPUS) == {"A10"}
    assert admitted("H20", NODE_GPUS) == {"H20"}
    assert admitted("H100", NODE_GPUS) == {"H100-SXM", "H100-PCIe"}
    assert admitted("A100", NODE_GPUS) == {"A100-40GB", "A100-80GB"}
    assert admitted("h100-sxm5", NODE_GPUS) == {"H100-SXM"}
    assert admitted("NVIDIA H100 80GB HBM3", NODE_GPUS) == {"H100-SXM"}
    assert admitted("grace hopper", NODE_GPUS) == {"GH200"}
    assert admitted("3090", NODE_GPUS) == {"RTX-3090"}
    assert admitted("RTX", NODE_GPUS) >= {"RTX-3090", "RTX-3090-Ti", "RTX-4090", "RTX-A6000"}
    assert admitted("t4", NODE_GPUS) == {"T4", "Tesla-T4"}
    assert admitted("H100,L40S", NODE_GPUS) == {"H100-SXM", "H100-PCIe", "L40S"}
    assert admitted("gpu", NODE_GPUS) == set()
