"""`AgentMembers`: the sessions a gossip agent probes and gossips with, and the evicted
sessions whose peers it may reconnect to.

The member set is every session the replica holds a record of that is not LEFT, our own left
out. It is built once from the replica and then follows each replica change in O(1)
(`on_change`): rebuilding it per membership change was O(N) per node, O(N^2) for a fleet.
`version` moves with every membership change (the prober rescans its list only then). A
revoked member's sessions are purged from the replica (`purge_peer`) and the set is rebuilt
on next use, without them.

Sessions evicted (failed, not left) that the replica still holds are kept apart: after a
long partition both sides evicted each other and nobody would ever contact the other side
again, so the agent contacts their peers now and then (`reconnect_candidates`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from llmfabric.gossip.changes import evicted, membership_changed
from llmfabric.membership.memberset import Member, MemberSet
from llmfabric.net.transport import PeerId
from llmfabric.registry.records import Lifecycle
from llmfabric.registry.replica import Change, Replica


class AgentMembers:
    """The members of the agent's session `session_id` (of our peer `peer_id`) in `replica`;
    the agent passes it every replica change (`on_change`)."""

    def __init__(self, replica: Replica, session_id: str, peer_id: PeerId) -> None:
        self.replica = replica
        self.session_id = session_id
        self.peer_id = peer_id
        self._set: MemberSet | None = None  # (None: built from the replica on next use)
        self.version = 0  # bumped with every membership change
        self._evicted: set[str] = set()  # evicted sessions we still hold

    def current(self) -> MemberSet:
        """Every known non-LEFT session but our own (read it, do not change it)."""
        if self._set is None:
            own = self.session_id
            self._set = MemberSet(
                Member(sid, e.record.record.peer_id)
                for sid, e in self.replica.entries.items()
                if e.record is not None and e.state is not Lifecycle.LEFT and sid != own
            )
        return self._set

    def peers(self) -> list[PeerId]:
        """The peers of `current()`, sorted (a fresh list, O(N): not for hot paths)."""
        return sorted({m.peer_id for m in self.current()} - {self.peer_id})

    def sample(self, rng: random.Random, k: int) -> list[PeerId]:
        """Up to k distinct member peers at random (O(k))."""
        return [m.peer_id for m in self.current().sample(rng, k, skip_peers=(self.peer_id,))]

    def adopt(self, members: MemberSet, evicted_sessions: Iterable[str]) -> None:
        """Simulations: start from a shared member set (forked, not copied) and the evicted
        sessions of the shared replica state."""
        self._set = members.fork()
        self._set.discard(Member(self.session_id, self.peer_id))
        self.version += 1
        self._evicted = set(evicted_sessions)

    def purge_peer(self, peer_id: PeerId, sessions: Iterable[str] | None = None) -> list[str]:
        """Drop every session of `peer_id` (or only those in `sessions`: a revoked
        certificate's) from the replica (its membership was revoked; Replica.purge_peer):
        no longer members, so no longer probed nor gossiped with. Our own peer is never
        purged. Returns the sessions dropped."""
        if peer_id == self.peer_id:
            return []
        sids = self.replica.purge_peer(peer_id, sessions)
        if sids:
            self._set = None  # rebuilt on next use, without them (O(N), once)
            self.version += 1
            self._evicted.difference_update(sids)
        return sids

    def on_change(self, change: Change) -> None:
        """Follow one replica change (O(1))."""
        if membership_changed(change):
            self.version += 1
            after = change.after
            e = after if after.record is not None else change.before
            if self._set is not None and e is not None and e.record is not None:
                m = Member(change.session_id, e.record.record.peer_id)
                if (after.record is not None and after.state is not Lifecycle.LEFT
                        and change.session_id != self.session_id):
                    self._set.add(m)
                else:
                    self._set.discard(m)
        if evicted(change.after):
            self._evicted.add(change.session_id)
        else:
            self._evicted.discard(change.session_id)

    def reconnect_candidates(self, wall: float, window_s: float) -> list[PeerId]:
        """Peers with a session evicted within `window_s` before `wall` and no session that
        is a member now."""
        members = self.current()
        out = set()
        for sid in list(self._evicted):  # O(evicted sessions), not O(replica)
            e = self.replica.entries.get(sid)
            if e is None or not evicted(e):  # compacted by GC
                self._evicted.discard(sid)
                continue
            assert e.evict is not None and e.record is not None
            peer = e.record.record.peer_id
            if wall - e.evict.issued_at <= window_s and peer != self.peer_id and not any(
                    Member(s, peer) in members for s in self.replica.peer_sessions(peer)):
                out.add(peer)
        return sorted(out)
