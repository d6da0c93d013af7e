"""The incremental routing index equals a from-scratch rebuild after any sequence of changes,
and a real replica's changes reach it without rebuilding anything."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, LoadHints, NodeMeta, NodeRecord, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.registry.views import NodeRegistry
from llmfabric.routing.candidates import candidates_by_model, model_is_known
from llmfabric.routing.index import CandidateIndex
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock

from .conftest import make_record

NAMES = ["a", "b", "c", "d"]
served = st.builds(
    ServedModel,
    st.sampled_from(NAMES),
    aliases=st.lists(st.sampled_from(NAMES), max_size=2).map(tuple),
    quant_bits=st.sampled_from([4, 16]),
)
upsert = st.tuples(
    st.just("upsert"),
    st.integers(0, 5),  # session
    st.lists(served, max_size=3).map(tuple),
    st.sampled_from(list(Lifecycle)),
    st.booleans(),  # suspected
    st.integers(0, 3),  # load hint
)
remove = st.tuples(st.just("remove"), st.integers(0, 5))


def _record(i: int, models: tuple[ServedModel, ...], state: Lifecycle, load: int) -> NodeRecord:
    rec = make_record(f"s{i}", provider=f"p{i % 2}", models=models, state=state)
    return dataclasses.replace(rec, meta=dataclasses.replace(rec.meta, load=LoadHints(load)))


def assert_equals_rebuild(index: CandidateIndex, live: dict[str, tuple[NodeRecord, bool]]
                          ) -> None:
    records = [live[sid] for sid in sorted(live)]
    rebuilt = candidates_by_model(records)
    assert index.names() == sorted(rebuilt)
    for name in [*NAMES, "unknown"]:
        assert list(index.candidates(name)) == rebuilt.get(name, [])  # order included
        assert index.is_known(name) == model_is_known(name, records)
    every = [c for bucket in rebuilt.values() for c in bucket]
    got = index.all_candidates()  # once per (session, model id), each one a real candidate
    assert {(c.session_id, c.model.id) for c in got} == {(c.session_id, c.model.id)
                                                          for c in every}
    assert len(got) == len({(c.session_id, c.model.id) for c in got})
    assert all(c in every for c in got)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(upsert, remove), max_size=40))
def test_incremental_index_equals_a_rebuild_after_any_changes(ops: list[tuple]) -> None:
    index = CandidateIndex()
    live: dict[str, tuple[NodeRecord, bool]] = {}
    for op in ops:
        if op[0] == "upsert":
            _, i, models, state, suspected, load = op
            rec = _record(i, models, state, load)
            index.update(rec.session_id, rec, suspected)
            live[rec.session_id] = (rec, suspected)
        else:
            sid = f"s{op[1]}"
            index.remove(sid)
            live.pop(sid, None)
        # snapshots are taken between changes too (cached views must be invalidated)
        index.candidates(NAMES[len(live) % len(NAMES)])
    assert_equals_rebuild(index, live)
    assert_equals_rebuild(CandidateIndex.from_records(live.values()), live)


def test_a_load_hint_replaces_one_candidate_and_rebuilds_nothing() -> None:
    recs = [make_record(f"s{i}", models=(ServedModel("m", aliases=("mm",)),)) for i in range(50)]
    index = CandidateIndex.from_records((r, False) for r in recs)
    before = index.candidates("m")
    edits = index.changes
    hot = dataclasses.replace(recs[7], meta=dataclasses.replace(recs[7].meta,
                                                                load=LoadHints(inflight=9)))
    index.update(hot.session_id, hot, False)
    assert index.changes == edits + 2  # one in-place replacement under "m", one under "mm"
    after = index.candidates("m")
    i = [c.session_id for c in before].index("s7")
    assert before[i].load.inflight == 0 and after[i].load.inflight == 9  # held snapshot kept
    assert [c.session_id for c in after] == [c.session_id for c in before]
    refreshed = dataclasses.replace(hot, version=hot.version + 1, updated_at=5.0)
    index.update(hot.session_id, refreshed, False)  # nothing a candidate carries changed
    assert index.changes == edits + 2 and index.candidates("m") is after


def _owner(key: NodeKey, clock: FakeClock, model: str) -> RecordOwner:
    o = RecordOwner(key, NodeMeta(models=(ServedModel(model),)), wall=clock.wall())
    o.set_state(Lifecycle.SERVING, wall=clock.wall())
    return o


def _from_scratch(replica: Replica) -> dict[str, list[object]]:
    recs = [(dataclasses.replace(v.record, state=v.state), v.suspected)
            for v in NodeRegistry(replica).all(include_left=False)]
    return {k: list(v) for k, v in candidates_by_model(recs).items()}


def test_replica_source_follows_real_changes_without_rebuilding() -> None:
    clock = FakeClock()
    keys = [NodeKey.generate() for _ in range(4)]
    owners = [_owner(k, clock, "m" if i < 3 else "n") for i, k in enumerate(keys)]
    replica = Replica(clock)
    for o in owners:
        replica.apply(o.current)
    source = ReplicaCandidateSource(lambda: replica)
    assert {c.session_id for c in source.candidates("m")} == {o.session_id for o in owners[:3]}

    def check() -> None:
        assert {k: list(source.index.candidates(k)) for k in source.index.names()} == (
            _from_scratch(replica))

    replica.apply(owners[0].update_meta(dataclasses.replace(
        owners[0].record.meta, load=LoadHints(inflight=3)), wall=clock.wall()))
    check()
    assert [c.load.inflight for c in source.candidates("m")
            if c.session_id == owners[0].session_id] == [3]
    s = owners[1].session_id  # suspected by one member: a flagged fallback candidate
    replica.apply(make_fact(keys[2], FactKind.SUSPECT, s, 1, clock.wall()))
    check()
    assert [c.suspected for c in source.candidates("m") if c.session_id == s] == [True]
    assert source.is_known("m")
    replica.apply(make_fact(keys[2], FactKind.EVICT, owners[2].session_id, 1, clock.wall()))
    replica.apply(owners[3].set_state(Lifecycle.LEFT, wall=clock.wall()))
    check()
    assert not source.is_known("n") and not source.candidates("n")
    assert source.rebuilds == 1

    rejoined = Replica(clock)  # the node rejoined under a new session: a new replica
    rejoined.apply(owners[1].current)
    current = [rejoined]
    switching = ReplicaCandidateSource(lambda: current[0])
    switching.candidates("m")
    current[0] = replica
    check_ids = {c.session_id for c in switching.candidates("m")}
    assert check_ids == {c.session_id for c in source.candidates("m")}
    assert switching.rebuilds == 2
    rejoined.apply(_owner(keys[3], clock, "m").current)  # the old replica no longer feeds it
    assert {c.session_id for c in switching.candidates("m")} == check_ids


def test_an_alias_squatting_another_providers_model_id_is_flagged_and_reflagged() -> None:
    own = make_record("s1", provider="alice", models=(ServedModel("llama"),))
    squat = make_record("s2", provider="mallory", models=(ServedModel("tiny", aliases=("llama",)),))
    index = CandidateIndex()
    index.update("s2", squat, False)
    assert [c.alias_conflict for c in index.candidates("llama")] == [False]  # nobody owns it
    index.update("s1", own, False)
    assert {c.session_id: c.alias_conflict for c in index.candidates("llama")} == {
        "s1": False, "s2": True}
    index.remove("s1")  # the owner left: the alias is no longer another provider's model id
    assert [c.alias_conflict for c in index.candidates("llama")] == [False]
    assert_equals_rebuild(index, {"s2": (squat, False)})
