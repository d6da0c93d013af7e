"""What a replica change means for the gossip agent: a load-hint refresh (sent fewer times),
a membership change (the member set follows), an eviction (a reconnect candidate)."""

from __future__ import annotations

import dataclasses

from llmfabric.registry.entry import Entry
from llmfabric.registry.records import Lifecycle
from llmfabric.registry.replica import Change


def is_minor(change: Change) -> bool:
    """A change that only refreshes load hints (or the timestamp) of a record: same lifecycle,
    incarnation and facts. Such changes get `minor_transmits` sends instead of a full rumour."""
    b, a = change.before, change.after
    if b is None or b.record is None or a.record is None:
        return False
    rb, ra = b.record.record, a.record.record
    return (
        b.state is a.state and rb.incarnation == ra.incarnation and b.suspects == a.suspects
        and b.evict == a.evict and b.evicts == a.evicts
        and dataclasses.replace(rb.meta, load=ra.meta.load) == ra.meta
    )


def membership_changed(change: Change) -> bool:
    """Whether `change` can add or remove a session from `GossipAgent.members()`."""
    before, after = change.before, change.after
    if before is None:
        return True
    return ((before.record is None) != (after.record is None)
            or (before.state is Lifecycle.LEFT) != (after.state is Lifecycle.LEFT))


def evicted(entry: Entry) -> bool:
    """Evicted (failed), not left by its owner: a reconnect candidate while recent."""
    return (entry.evict is not None and entry.record is not None
            and entry.record.record.state is not Lifecycle.LEFT)
