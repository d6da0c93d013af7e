"""The PD routing plan as a registry item: encoding round trip (hypothesis), hostile items
refused, trust only in the listed controllers' records, newest wins, the record codec's
bound, and a PD router following the feed."""

from __future__ import annotations

import dataclasses
import math
import random

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.identity import NodeKey
from llmfabric.registry.codec import sign_record, verify_record
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.records import Lifecycle, ModelRole, NodeRecord, ServedModel
from llmfabric.registry.signing import new_session_id
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.pd import PDPlanTable, PDRouter, PlanError, split
from llmfabric.routing.pd_plan import (
    MAX_PLAN_ITEM_BYTES,
    PlanFeed,
    PlanItem,
    decode_plan,
    encode_plan,
    newest_plans,
)

from .conftest import make_record

TABLE = PDPlanTable("p1", ("a", "b"), ("c",), (0.75, 0.25), ((1.0,), (1.0,)))


def _item(plan_id: str = "p1", t: float = 100.0, table: PDPlanTable = TABLE) -> PlanItem:
    return PlanItem("llama-3.1-8b", t, dataclasses.replace(table, plan_id=plan_id))


def _raw(**changes: object) -> bytes:
    doc: dict[str, object] = {"v": 1, "m": "m", "t": 1.0, "id": "p", "pre": ["a"],
                              "dec": ["b"], "x": [1.0], "y": [[1.0]]}
    doc.update(changes)
    return bytes(msgpack.packb(doc, use_bin_type=True))


weights = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_encode_decode_round_trip(m: int, n: int, data: st.DataObject) -> None:
    table = PDPlanTable("plan-x", tuple(f"p{i}" for i in range(m)),
                        tuple(f"d{j}" for j in range(n)),
                        tuple(data.draw(st.lists(weights, min_size=m, max_size=m))),
                        tuple(tuple(data.draw(st.lists(weights, min_size=n, max_size=n)))
                              for _ in range(m)))
    item = PlanItem("llama-3.1-8b", data.draw(st.floats(0, 2e9)), table)
    assert decode_plan(encode_plan(item)) == item


@pytest.mark.parametrize(("data", "why"), [
    (b"", "bytes"),
    (b"\xc1", "msgpack"),
    (bytes(msgpack.packb([1, 2])), "version"),
    (_raw(v=2), "version"),
    (_raw(m=""), "model"),
    (_raw(t=math.nan), "issue time"),
    (_raw(t=True), "issue time"),
    (_raw(id=""), "plan_id"),
    (_raw(x=[math.inf]), "finite"),
    (_raw(x=[-1.0]), "finite"),
    (_raw(x=[True]), "numbers"),
    (_raw(x=[1.0, 1.0]), "x must have"),
    (_raw(y=[[1.0, 2.0]]), "x must have"),
    (_raw(pre=["a", "a"], x=[1.0, 1.0], y=[[1.0], [1.0]]), "twice"),
    (_raw(pre=[1]), "session ids"),
    (_raw(pre="a"), "session ids"),
    (_raw(y="rows"), "rows"),
    (_raw(pre=["x" * 200]), "1-"),  # an id too long for the table
])
def test_malformed_plan_items_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(PlanError, match=why):
        decode_plan(data)


def test_oversized_plans_are_refused_both_ways() -> None:
    many = 400
    big = PDPlanTable("big", tuple(f"session-{i:04d}" for i in range(many)), ("d",),
                      (1.0,) * many, ((1.0,),) * many)
    with pytest.raises(PlanError, match="fit in a record"):
        encode_plan(PlanItem("m", 1.0, big))
    with pytest.raises(PlanError, match="bytes"):
        decode_plan(b"\x90" * (MAX_PLAN_ITEM_BYTES + 1))


def test_the_record_codec_carries_the_item_signed_and_bounds_it() -> None:
    key = NodeKey.generate()
    rec = NodeRecord(new_session_id(key.public_bytes), key.peer_id, key.public_bytes,
                     Lifecycle.SERVING, 0, 1, 0.0, make_record("x").meta)
    with_plan = dataclasses.replace(rec, meta=dataclasses.replace(
        rec.meta, pd_plan=encode_plan(_item())))
    signed = sign_record(key, with_plan)
    assert decode_plan(verify_record(signed.body, signed.signature).record.meta.pd_plan) \
        == _item()
    plain = sign_record(key, rec)  # no plan: the field is not in the body at all
    assert b"pd_plan" not in plain.body and b"pd_plan" in signed.body
    huge = dataclasses.replace(rec, meta=dataclasses.replace(rec.meta, pd_plan=b"x" * 9000))
    bad = sign_record(key, huge)
    with pytest.raises(InvalidRecord, match="pd_plan"):
        verify_record(bad.body, bad.signature)


def _publisher(sid: str, item: bytes, state: Lifecycle = Lifecycle.SERVING) -> NodeRecord:
    rec = make_record(sid, state=state)
    return dataclasses.replace(rec, meta=dataclasses.replace(rec.meta, pd_plan=item))


def test_only_trusted_controllers_plans_count_and_the_newest_wins() -> None:
    ctl, other = "peer-ctl", "peer-intruder"
    records = [_publisher("ctl", encode_plan(_item("old", 100.0))),
               _publisher("intruder", encode_plan(_item("evil", 999.0))),
               _publisher("ctl2", encode_plan(_item("new", 200.0))),
               _publisher("ctl3", b"garbage")]
    def newest(controllers: set[str]) -> PlanItem | None:
        return newest_plans(records, controllers).get("llama-3.1-8b")

    assert newest({ctl}) == _item("old", 100.0)
    assert newest({ctl, "peer-ctl2"}) == _item("new", 200.0)
    assert newest({ctl, other}) == _item("evil", 999.0)  # (only if listed)
    assert newest(set()) is None
    assert newest({"peer-ctl3"}) is None  # malformed: ignored
    left = [_publisher("ctl", encode_plan(_item("old", 100.0)), Lifecycle.LEFT)]
    assert newest_plans(left, {ctl}) == {}  # a controller that left takes its plan along


@pytest.mark.hostile
def test_plans_are_per_model_and_never_from_the_far_future() -> None:
    """The newest trusted plan was installed for every model (one controller's plan for
    model B wiped model A's split), and a plan issued at 1e300 would win forever."""
    table_a = PDPlanTable("a", ("pa",), ("da",), (1.0,), ((1.0,),))
    table_b = PDPlanTable("b", ("pb",), ("db",), (1.0,), ((1.0,),))
    records = [_publisher("ctl", encode_plan(PlanItem("model-a", 100.0, table_a))),
               _publisher("ctl2", encode_plan(PlanItem("model-b", 200.0, table_b)))]
    feed = PlanFeed(lambda: records, lambda: 1, ["peer-ctl", "peer-ctl2"], wall=lambda: 1000.0)
    assert feed({"model-a"}) == table_a and feed({"model-b", "alias"}) == table_b
    assert feed({"model-c"}) is None
    future = PDPlanTable("f", ("pf",), ("df",), (1.0,), ((1.0,),))
    records.append(_publisher("ctl3", encode_plan(PlanItem("model-a", 1e300, future))))
    feed = PlanFeed(lambda: records, lambda: 2, ["peer-ctl", "peer-ctl3"], wall=lambda: 1000.0)
    assert feed({"model-a"}) == table_a


def _cand(sid: str, role: ModelRole) -> Candidate:
    rec = make_record(sid, models=(ServedModel("m", role=role),))
    return Candidate.from_record(rec, rec.meta.models[0])


def test_a_router_follows_the_feed_and_recomputes_only_on_new_versions() -> None:
    records: list[NodeRecord] = []
    version = [0]
    calls = [0]

    def read() -> list[NodeRecord]:
        calls[0] += 1
        return records

    feed = PlanFeed(read, lambda: version[0], ["peer-ctl"])
    router = PDRouter(random.Random(1))
    router.set_feed(feed)
    cands = [_cand("a", ModelRole.PREFILL), _cand("b", ModelRole.PREFILL),
             _cand("c", ModelRole.DECODE)]
    assert router.current({"m"}) is None
    table = PDPlanTable("p", ("a", "b"), ("c",), (1.0, 0.0), ((1.0,), (1.0,)))
    records.append(_publisher("ctl", encode_plan(PlanItem("m", 5.0, table))))
    assert router.current({"m"}) is None  # the replica did not change (cached)
    version[0] += 1
    assert router.current({"m"}) == table
    pools = split(cands, router.current({"m"}))
    assert pools is not None and pools.plan == table
    assert {router.pick_prefill(pools).session_id for _ in range(50)} == {"a"}  # type: ignore[union-attr]
    n = calls[0]
    router.current({"m"})
    assert calls[0] == n
    assert PlanFeed(read, lambda: 9, [])({"m"}) is None  # no --controller: no plan
