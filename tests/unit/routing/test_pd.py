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
    pools = split([cand("p", "prefill"), cand("d", "decode")])  # a fleet deployed for PD
    assert pools is not None and [c.session_id for c in pools.prefill] == ["p"]
    # colocated nodes are live and there is no plan: routed as usual
    assert split([cand("p", "prefill"), cand("d", "decode"), cand("b", "both")]) is None
    # a plan decides, whatever else is live; its sessions may be "both" nodes
    plan = PDPlanTable("plan", ("p", "b"), ("d",), (0.5, 0.5), ((1.0,), (1.0,)))
    pools = split([cand("p", "prefill"), cand("d", "decode"), cand("b", "both")], plan)
    assert pools is not None
    assert [c.session_id for c in pools.prefill] == ["p", "b"]
    assert [c.session_id for c in pools.decode] == ["d"]
    # the plan's decode side is dead: routed as usual, not to a node the plan did not name
    assert split([cand("p", "prefill"), cand("d", "decode", suspected=True),
                  cand("b", "both")], plan) is None


@pytest.mark.hostile
def test_a_member_claiming_a_role_takes_no_phase_it_was_not_given() -> None:
    """A member announcing role=prefill among colocated nodes took the prefill of every
    request for the model (pure nodes went first): it saw every prompt, unbounded by any
    load share. Without a plan such a fleet is not split; under a plan only the sessions it
    names take a phase."""
    colocated = [cand(f"b{i}", "both") for i in range(3)]
    assert split([*colocated, cand("evil", "prefill")]) is None
    plan = PDPlanTable("plan", ("p1",), ("d1",), (1.0,), ((1.0,),))
    cands = [cand("p1", "prefill"), cand("d1", "decode"), cand("evil", "prefill"),
             cand("evil2", "decode")]
    pools = split(cands, plan)
    assert pools is not None
    r = PDRouter(random.Random(1))
    r.set_plan(plan)
    assert {r.pick_prefill(pools).session_id for _ in range(200)} == {"p1"}  # type: ignore[union-attr]
    assert {r.pick_decode(pools, "p1").session_id for _ in range(200)} == {"d1"}  # type: ignore[union-attr]
    assert r.pick_prefill(pools, tried=("p1",)) is None  # never the claimant


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
    if any(c.model.role == "both" and not c.suspected for c in cands):
        assert pools is None  # no plan and colocated nodes live: no split
    if pools is None:
        return
    r = PDRouter(random.Random(seed))
    for got, side in ((r.pick_prefill(pools, tried), "prefill"),
                      (r.pick_decode(pools, "s0", tried), "decode")):
        if got is None:
            continue
        assert not got.suspected and got.session_id not in tried
        assert got.model.role == side


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


@pytest.mark.hostile
def test_a_prefill_nodes_kv_handle_goes_on_only_flat_and_bounded() -> None:
    import orjson

    from llmfabric.ingress.errors import Reply
    from llmfabric.ingress.pd_path import MAX_HANDLE_BYTES, handle_of

    def reply(params: object) -> Reply:
        return Reply(200, orjson.dumps({"kv_transfer_params": params}))

    nixl = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e1",
            "remote_host": "10.0.0.5", "remote_port": 5600,
            "remote_block_ids": list(range(2048))}  # a 32k-token prompt's blocks
    assert handle_of(reply(nixl)) == nixl
    assert handle_of(reply({**nixl, "hosts": ["a", None]})) is not None  # (nulls are flat)
    assert handle_of(reply({**nixl, "x": {"nested": {"deep": 1}}})) is None
    assert handle_of(reply({**nixl, "x": [[1], [2]]})) is None
    assert handle_of(reply({**nixl, "pad": "p" * MAX_HANDLE_BYTES})) is None
    assert handle_of(reply({**nixl, "do_remote_prefill": "yes"})) is None
    assert handle_of(Reply(200, b"not json")) is None
