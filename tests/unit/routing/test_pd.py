"""routing/pd.py: prefill/decode pools from the records' roles, plan weights renormalised over
live untried nodes, colocated fallback when no pair is live, plan validation."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.registry.records import ModelRole, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.pd import PDPlanTable, PDRouter, PlanError, split

from .conftest import make_record


def cand(sid: str, role: str, suspected: bool = False) -> Candidate:
    model = ServedModel("m", role=ModelRole(role))
    return Candidate.from_record(make_record(sid, models=(model,)), model, suspected)


def test_no_split_without_a_live_disaggregated_pair() -> None:
    assert split([cand("a", "both"), cand("b", "both")]) is None
    assert split([cand("p", "prefill"), cand("q", "prefill")]) is None  # nobody decodes
    assert split([cand("p", "prefill"), cand("d", "decode", suspected=True)]) is None
    pools = split([cand("p", "prefill"), cand("d", "decode"), cand("b", "both")])
    assert pools is not None and [c.session_id for c in pools.both] == ["b"]
    # a dead decode side borrows the colocated node
    pools = split([cand("p", "prefill"), cand("d", "decode", suspected=True),
                   cand("b", "both")])
    assert pools is not None
    r = PDRouter(random.Random(0))
    assert r.pick_decode(pools, "p").session_id == "b"  # type: ignore[union-attr]


def test_plan_weights_are_followed_and_renormalised_when_a_node_is_lost() -> None:
    cands = [cand("p1", "prefill"), cand("p2", "prefill"), cand("d1", "decode"),
             cand("d2", "decode"), cand("d3", "decode")]
    plan = PDPlanTable("plan-1", ("p1", "p2"), ("d1", "d2", "d3"), (0.75, 0.25),
                       ((0.5, 0.5, 0.0), (0.0, 0.0, 1.0)))
    r = PDRouter(random.Random(7))
    r.set_plan(plan)
    pools = split(cands)
    assert pools is not None
    pre = Counter(r.pick_prefill(pools).session_id for _ in range(4000))  # type: ignore[union-attr]
    assert 0.71 < pre["p1"] / 4000 < 0.79
    dec = Counter(r.pick_decode(pools, "p1").session_id for _ in range(2000))  # type: ignore[union-attr]
    assert dec["d3"] == 0 and 0.45 < dec["d1"] / 2000 < 0.55
    assert {r.pick_decode(pools, "p2").session_id for _ in range(50)} == {"d3"}  # type: ignore[union-attr]
    # d3 suspected: p2's share falls back to uniform over the live decode nodes
    lost = split([c if c.session_id != "d3" else cand("d3", "decode", True) for c in cands])
    assert lost is not None
    assert {r.pick_decode(lost, "p2").session_id for _ in range(200)} == {"d1", "d2"}  # type: ignore[union-attr]
    assert r.pick_decode(pools, "p1", tried=("d1", "d2", "d3")) is None


@given(st.lists(st.tuples(st.sampled_from(["prefill", "decode", "both"]), st.booleans()),
                min_size=1, max_size=8),
       st.lists(st.integers(0, 7), max_size=4), st.integers(0, 2**32))
def test_picks_are_live_untried_and_of_the_right_side(
    spec: list[tuple[str, bool]], tried_idx: list[int], seed: int,
) -> None:
    cands = [cand(f"s{i}", role, sus) for i, (role, sus) in enumerate(spec)]
    tried = {f"s{i}" for i in tried_idx}
    pools = split(cands)
    if pools is None:
        return
    r = PDRouter(random.Random(seed))
    for got, side in ((r.pick_prefill(pools, tried), "prefill"),
                      (r.pick_decode(pools, "s0", tried), "decode")):
        if got is None:
            continue
        assert not got.suspected and got.session_id not in tried
        pure = [c for c in cands if c.model.role == side and not c.suspected
                and c.session_id not in tried]
        assert got.model.role == (side if pure else "both")


@pytest.mark.parametrize("kw", [
    {"x": (1.0,)}, {"y": ((1.0,),)}, {"x": (float("nan"), 1.0)}, {"x": (-1.0, 1.0)},
    {"prefill": ("a", "a")}, {"plan_id": ""}, {"prefill": tuple(f"p{i}" for i in range(2000))},
])
def test_malformed_plans_are_refused(kw: dict[str, object]) -> None:
    base: dict[str, object] = {"plan_id": "p", "prefill": ("a", "b"), "decode": ("c",),
                               "x": (0.5, 0.5), "y": ((1.0,), (1.0,))}
    with pytest.raises(PlanError):
        PDPlanTable(**{**base, **kw})  # type: ignore[arg-type]


def test_a_controller_routing_decision_becomes_a_session_table() -> None:
    from llmfabric.scheduler.decisions import SetRouting

    d = SetRouting("plan-2", (0.5, 0.3, 0.2), ((1.0, 0.0), (0.0, 1.0), (0.5, 0.5)),
                   prefill_sessions=("n2", "n2", "n3"), decode_sessions=("n0", "n1"))
    t = PDPlanTable.from_routing(d)
    assert t.prefill == ("n2", "n3") and t.decode == ("n0", "n1")
    assert t.x == pytest.approx((0.8, 0.2))
    assert t.y[0] == pytest.approx((0.5 / 0.8, 0.3 / 0.8)) and t.y[1] == pytest.approx((0.5, 0.5))
    with pytest.raises(PlanError):
        PDPlanTable.from_routing(SetRouting("p", (1.0,), ((1.0,),)))  # no sessions bound
    with pytest.raises(PlanError):
        PDPlanTable.from_routing(SetRouting("p", (1.0,), ((1.0,),), ("a", "b"), ("c",)))
