"""What a replica refuses from members it does not trust: the registry's hostile-input limits.

Any admitted member can sign facts and records, so a replica checks more than signatures:
- a fact about a session whose record we do not hold is refused (`unknown_session`): facts
  never create entries, so an attacker cannot fill the map with made-up session ids;
- a fact's author must be a member we know (a peer with a record in the replica, any state;
  `unknown_author`): a forwarder cannot vouch for keys that never joined;
- a fact's incarnation is at most the record's + 1 (`incarnation`): a SUSPECT at 2**63-1
  would otherwise be unrefutable;
- new facts per author are rate limited by a token bucket (`rate_limited`); honest authors
  issue about one SUSPECT per probe period and EVICTs only when suspicions time out;
- new record versions per peer are rate limited by a byte bucket (`record_rate_limited`): a
  member re-signing its record in a loop would otherwise have every replica store and relay
  each version. Honest nodes republish when load, spend or key grants change, at most about
  three versions a second of a few KiB; the replica's own peer is never limited;
- at most `max_evicts_per_entry` EVICT facts per session (`too_many_facts`);
- a peer holds at most `max_sessions_per_peer` non-LEFT sessions (`sessions_per_peer`), and
  at most `max_held_sessions_per_peer` sessions in any state: a record born LEFT is not
  live, but 3,000 of them from one key held 110 MB for a day (`sessions_held`);
- an optional `RecordPolicy` (e.g. identity.provider.CertRecordPolicy: the record must carry
  an operator-signed membership certificate naming its key) can refuse records.
An eviction needs EVICT facts from `eviction_quorum` (k) distinct authors at one incarnation,
capped by the fleet size (registry.entry.decisive_evict, `quorum_for`).
All refusals happen at the gate, outside the CRDT join; an item refused now (rate limit,
record not yet seen) is offered again by anti-entropy later.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from llmfabric.registry.codec import MAX_BODY_BYTES
from llmfabric.registry.errors import RegistryError
from llmfabric.registry.records import NodeRecord

MAX_TRACKED_AUTHORS = 4096


@dataclass(frozen=True, slots=True)
class TrustConfig:
    # Distinct authors whose EVICT facts (same incarnation) evict a session; capped by the
    # number of other live peers, so a 2-node fleet can still evict a dead peer.
    eviction_quorum: int = 3
    max_sessions_per_peer: int = 8
    # Sessions of one peer held in any state (LEFT ones stay retention_s, 24 h): an honest
    # node restarting its engine every few minutes for a day stays well under it.
    max_held_sessions_per_peer: int = 512
    # New facts accepted per author: `fact_burst` at once, then `fact_rate_per_s`.
    fact_rate_per_s: float = 1.0
    fact_burst: float = 256.0
    max_evicts_per_entry: int = 64
    # Bytes of new record versions accepted per peer: `record_burst_bytes` at once, then
    # `record_bytes_per_s`: 16 records of the largest size (codec.MAX_BODY_BYTES) at once,
    # then two a second; an honest node publishes a few KiB a second, at most about three
    # versions (load, spend, key grants), and a dozen versions as it starts.
    record_bytes_per_s: float = 32 * 1024
    record_burst_bytes: float = 256 * 1024

    def __post_init__(self) -> None:
        if self.eviction_quorum < 1 or self.max_sessions_per_peer < 1:
            raise RegistryError("eviction_quorum and max_sessions_per_peer must be >= 1")
        if self.max_held_sessions_per_peer < self.max_sessions_per_peer:
            raise RegistryError("max_held_sessions_per_peer must be >= max_sessions_per_peer")
        if not (self.fact_rate_per_s > 0 and self.fact_burst >= 1):
            raise RegistryError("fact_rate_per_s must be > 0 and fact_burst >= 1")
        if self.max_evicts_per_entry < self.eviction_quorum:
            raise RegistryError("max_evicts_per_entry must be >= eviction_quorum")
        if not (self.record_bytes_per_s > 0 and self.record_burst_bytes >= MAX_BODY_BYTES):
            raise RegistryError("record_bytes_per_s must be > 0 and record_burst_bytes >= "
                                f"{MAX_BODY_BYTES} (a record of the largest size must pass)")

    def quorum_for(self, live_peers: int) -> int:
        """k capped by the fleet: at most the live peers other than the suspected one."""
        return max(1, min(self.eviction_quorum, live_peers - 1))


class RecordPolicy(Protocol):
    """Decides whether a verified record may enter; the reason string is counted."""

    def refuse(self, record: NodeRecord, now_wall: float) -> str | None: ...

    def max_sessions(self, record: NodeRecord) -> int | None: ...


class AuthorLimiter:
    """A token bucket per author, for at most MAX_TRACKED_AUTHORS authors (LRU). A bucket
    that has refilled is forgotten (the least recently used first): only authors still
    below a full bucket are held. `allow` spends `cost` tokens (one item, or its bytes)."""

    def __init__(self, rate: float, burst: float) -> None:
        self._rate = rate
        self._burst = burst
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, author: str, now: float, cost: float = 1.0) -> bool:
        tokens, last = self._buckets.pop(author, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        ok = tokens >= cost
        self._buckets[author] = (tokens - cost if ok else tokens, now)
        if len(self._buckets) > MAX_TRACKED_AUTHORS:
            self._buckets.popitem(last=False)
        while self._buckets:  # (least recently used first)
            _, (left, last) = next(iter(self._buckets.items()))
            if left + (now - last) * self._rate < self._burst:
                break
            self._buckets.popitem(last=False)
        return ok

    def __len__(self) -> int:
        return len(self._buckets)
