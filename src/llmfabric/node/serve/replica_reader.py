"""Adapts the GossipAgent's replica to the read-only views the HTTP API and ingress need."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmfabric.clock import Clock
from llmfabric.gossip.agent import GossipAgent
from llmfabric.node.serve.http_api import ObservedRecord
from llmfabric.registry.provider import key_fingerprint_identity
from llmfabric.registry.records import NodeRecord
from llmfabric.registry.replica import Replica

if TYPE_CHECKING:  # (the daemon builds readers; no runtime import back)
    from llmfabric.node.daemon import Node


class AgentReplicaReader:
    """Reads whatever agent is current (it changes when an evicted node rejoins)."""

    def __init__(
        self, agent: Callable[[], GossipAgent], clock: Clock,
        identify: Callable[[NodeRecord], str] = key_fingerprint_identity,
    ) -> None:
        self._agent = agent
        self._clock = clock
        self._identify = identify

    @property
    def session_id(self) -> str:
        return self._agent().session_id

    def observed(self) -> list[ObservedRecord]:
        # last_seen is local monotonic time in the replica; the API shows wall time.
        offset = self._clock.wall() - self._clock.now()
        return [
            ObservedRecord(
                dataclasses.replace(v.record, state=v.state), v.suspected, v.last_seen + offset,
                self._identify(v.record),
            )
            for v in self._agent().nodes.all()
        ]

    def records_with_suspicion(self) -> list[tuple[NodeRecord, bool]]:
        """(record with its effective lifecycle, suspected) for the routing candidate source."""
        return [
            (dataclasses.replace(v.record, state=v.state), v.suspected)
            for v in self._agent().nodes.all(include_left=False)
        ]

    def live_records(self) -> list[NodeRecord]:
        """Records (effective lifecycle) of the non-LEFT, unsuspected sessions."""
        return [r for r, suspected in self.records_with_suspicion() if not suspected]

    def peer_of(self, session_id: str) -> str | None:
        view = self._agent().nodes.get(session_id)
        return None if view is None else view.record.peer_id

    def replica(self) -> Replica:
        """The current agent's replica (routing.replica_source follows its changes)."""
        return self._agent().replica

    def version(self) -> int:
        return self._agent().replica.applied

    def raw_records(self) -> list[dict[str, Any]]:
        out = []
        for sid, entry in sorted(self._agent().replica.entries.items()):
            rec = entry.record
            out.append(
                {
                    "session_id": sid,
                    "record": None
                    if rec is None
                    else {
                        "body": rec.body.hex(),
                        "signature": rec.signature.hex(),
                        "peer_id": rec.record.peer_id,
                        "state": rec.record.state.name,
                        "incarnation": rec.record.incarnation,
                        "version": rec.record.version,
                    },
                    "suspects": [
                        {"author": f.author, "incarnation": f.incarnation} for f in entry.suspects
                    ],
                    "evicted": entry.evict is not None,
                    # EVICT facts held as evidence (an eviction needs a quorum of authors)
                    "evicts": [
                        {"author": f.author, "incarnation": f.incarnation} for f in entry.evicts
                    ],
                }
            )
        return out


def current_session_reader(node: Node, clock: Clock | None = None) -> AgentReplicaReader:
    """The fleet as the node's CURRENT session sees it (the controllers' view): an eviction
    and rejoin replace the node's agent, so it is looked up on every read, never captured."""
    def agent() -> GossipAgent:
        current = node.agent
        if current is None:
            raise RuntimeError("the node has no session (it is stopping)")
        return current

    return AgentReplicaReader(agent, clock if clock is not None else node.clock,
                              node.providers.identity)
