"""The controller reads the fleet through the node's CURRENT session: an eviction and rejoin
replace the node's agent, and a reader that captured the old one would read a closed replica
(issue 18's finding about `llmfabric controller`)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from llmfabric.clock import SystemClock
from llmfabric.node.serve.replica_reader import current_session_reader
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord

pytestmark = pytest.mark.unit


def _record(sid: str, peer: str) -> NodeRecord:
    return NodeRecord(sid, peer, b"k" * 32, Lifecycle.SERVING, 0, 1, 1000.0, NodeMeta())


class _Nodes:
    def __init__(self, views: list[Any]) -> None:
        self.views = views

    def all(self, include_left: bool = True) -> list[Any]:
        return [v for v in self.views if include_left or v.state is not Lifecycle.LEFT]

    def get(self, sid: str) -> Any:
        return next((v for v in self.views if v.record.session_id == sid), None)


def _agent(*records: tuple[NodeRecord, bool]) -> Any:
    views = [types.SimpleNamespace(record=r, state=r.state, suspected=s, last_seen=0.0)
             for r, s in records]
    return types.SimpleNamespace(nodes=_Nodes(views))


def test_reader_follows_the_node_to_its_new_session() -> None:
    # (the node's provider verifier names each record's verified identity in the views)
    verifier = types.SimpleNamespace(identity=lambda rec: f"verified:{rec.peer_id}")
    node = types.SimpleNamespace(agent=_agent((_record("old", "p1"), False)),
                                 providers=verifier)
    reader = current_session_reader(node, SystemClock())  # type: ignore[arg-type]
    assert [r.session_id for r in reader.live_records()] == ["old"]
    assert [o.verified_provider for o in reader.observed()] == ["verified:p1"]
    # the node was evicted and rejoined: a new agent with another view of the fleet
    node.agent = _agent((_record("new", "p2"), False), (_record("sus", "p3"), True))
    assert [r.session_id for r in reader.live_records()] == ["new"]  # suspected left out
    assert reader.peer_of("new") == "p2" and reader.peer_of("old") is None
    node.agent = None  # stopping
    with pytest.raises(RuntimeError, match="no session"):
        reader.live_records()
