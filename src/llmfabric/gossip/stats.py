"""Counters of one gossip agent: messages and bytes by kind, drops and rejections by reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class AgentStats:
    msgs_out: Counter[str] = field(default_factory=Counter)
    msgs_in: Counter[str] = field(default_factory=Counter)
    bytes_out: int = 0
    bytes_in: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # undecodable messages, by reason
    # Items refused, by reason: forged or invalid (`signature`, `peer_id`, `session`, `schema`,
    # `garbled`, `oversized`) and the replica's own refusals (`tombstoned`, `stale`, `future`,
    # `bad_timestamp`, `not_admitted`).
    rejected: Counter[str] = field(default_factory=Counter)
    suspicions_raised: int = 0
    suspicions_spared: int = 0  # not raised: K confirmations already stood (Lifeguard cap)
    evictions_issued: int = 0
    refutations: int = 0
    evictions_refuted: int = 0  # our own session was evicted while alive; we refuted it
    loop_errors: int = 0
    seed_contacts: int = 0  # re-contacts of the seed peers while no member was known
    rebootstraps: int = 0  # bootstrap addresses dialled again while cut off (rebootstrap.py)
    reconnects: int = 0  # sync attempts with peers of evicted sessions (partition healing)

    def snapshot(self) -> dict[str, Any]:
        return {
            "msgs_out": dict(self.msgs_out),
            "msgs_in": dict(self.msgs_in),
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "dropped": dict(self.dropped),
            "rejected": dict(self.rejected),
            "suspicions_raised": self.suspicions_raised,
            "suspicions_spared": self.suspicions_spared,
            "evictions_issued": self.evictions_issued,
            "refutations": self.refutations,
            "evictions_refuted": self.evictions_refuted,
            "loop_errors": self.loop_errors,
            "seed_contacts": self.seed_contacts,
            "rebootstraps": self.rebootstraps,
            "reconnects": self.reconnects,
        }
