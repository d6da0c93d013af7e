"""Make a key a known member of a replica (its JOIN record is in it), so the facts it signs
pass the replica's `unknown_author` check (registry.guard)."""

from __future__ import annotations

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import NodeMeta
from llmfabric.registry.replica import Replica


def joined(replica: Replica, wall: float, key: NodeKey | None = None) -> NodeKey:
    """`key` (a fresh one by default) with a JOIN record applied to `replica`."""
    key = key or NodeKey.generate()
    replica.apply(RecordOwner(key, NodeMeta(), wall=wall).current)
    return key
