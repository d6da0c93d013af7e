from __future__ import annotations

from llmfabric.registry.records import Lifecycle, ServedModel
from llmfabric.routing import candidates_by_model, candidates_for, model_is_known

from .conftest import make_record


def test_only_serving_matching_sessions_are_candidates_and_suspected_ones_are_flagged() -> None:
    recs = [
        (make_record("a"), False),
        (make_record("b", state=Lifecycle.JOIN), False),
        (make_record("c", state=Lifecycle.DOWN), False),
        (make_record("d"), True),  # suspected: a flagged fallback candidate
        (make_record("e", models=(ServedModel("other"),)), False),
        (make_record("f", models=(ServedModel("x", aliases=("m",)),)), False),
    ]
    got = sorted((c.session_id, c.suspected) for c in candidates_for("m", recs))
    assert got == [("a", False), ("d", True), ("f", False)]
    f = next(c for c in candidates_for("m", recs) if c.session_id == "f")
    assert f.model.id == "x"
    assert f.peer_id == "peer-f"


def test_model_is_known_counts_down_but_not_left() -> None:
    recs = [(make_record("a", state=Lifecycle.DOWN), False)]
    assert model_is_known("m", recs)
    assert not model_is_known("m", [(make_record("a", state=Lifecycle.LEFT), False)])
    assert not model_is_known("zzz", recs)


def test_index_by_model_includes_aliases_once_per_session() -> None:
    recs = [(make_record("a", models=(ServedModel("x", aliases=("y", "x")),)), False)]
    index = candidates_by_model(recs)
    assert [c.session_id for c in index["x"]] == ["a"]
    assert [c.session_id for c in index["y"]] == ["a"]
