"""Read-only views over the local replica: NodeRegistry and ModelRegistry.

Both answer from the local replica only (no network). A session is a routing candidate when
its effective lifecycle is SERVING and it is not suspected. Entries that only hold facts (no
owner record seen yet) are not shown. LEFT entries are shown until GC compacts them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmfabric.registry.entry import Entry
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.registry.replica import Replica


@dataclass(frozen=True, slots=True)
class NodeView:
    session_id: str
    # The owner's latest record, except that `record.state` is the effective lifecycle (LEFT
    # once evicted) so that code reading NodeRecord.state never routes to an evicted session.
    record: NodeRecord
    state: Lifecycle  # effective lifecycle, same as record.state
    suspected: bool
    suspicions: int  # distinct members whose unrefuted suspicion we hold
    last_seen: float  # local monotonic time of the last change we merged for it

    @property
    def routable(self) -> bool:
        return self.state is Lifecycle.SERVING and not self.suspected


def view_of(entry: Entry, last_seen: float) -> NodeView | None:
    if entry.record is None:
        return None
    rec = entry.record.record
    if rec.state is not entry.state:
        rec = dataclasses.replace(rec, state=entry.state)
    return NodeView(
        entry.session_id, rec, entry.state, entry.suspected,
        len(entry.suspects), last_seen,
    )


class NodeRegistry:
    """Nodes with hardware, lifecycle and suspicion, keyed by session id."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def get(self, session_id: str) -> NodeView | None:
        e = self._replica.entries.get(session_id)
        return None if e is None else view_of(e, self._replica.last_seen.get(session_id, 0.0))

    def all(self, *, include_left: bool = True) -> list[NodeView]:
        out = []
        for sid in sorted(self._replica.entries):
            v = self.get(sid)
            if v is not None and (include_left or v.state is not Lifecycle.LEFT):
                out.append(v)
        return out

    def routable(self) -> list[NodeView]:
        return [v for v in self.all(include_left=False) if v.routable]

    def by_peer(self, peer_id: str) -> list[NodeView]:
        return [v for v in self.all() if v.record.peer_id == peer_id]

    def __len__(self) -> int:
        return len(self.all())


class ModelRegistry:
    """Model id or alias -> sessions serving it."""

    def __init__(self, replica: Replica) -> None:
        self._nodes = NodeRegistry(replica)

    def sessions(self, model: str, *, routable_only: bool = True) -> list[NodeView]:
        views = self._nodes.routable() if routable_only else self._nodes.all(include_left=False)
        return [v for v in views if any(m.answers_to(model) for m in v.record.meta.models)]

    def models(self, *, routable_only: bool = True) -> dict[str, list[str]]:
        """Model id -> sorted session ids (aliases are folded into the id)."""
        views = self._nodes.routable() if routable_only else self._nodes.all(include_left=False)
        out: dict[str, list[str]] = {}
        for v in views:
            for m in v.record.meta.models:
                out.setdefault(m.id, []).append(v.session_id)
        return {k: sorted(s) for k, s in sorted(out.items())}
