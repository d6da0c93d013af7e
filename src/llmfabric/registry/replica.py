"""The local replica of the G-Map: verified ingestion, merge, bucketed digests and GC.

Every item (signed record or fact) goes through `Replica.ingest` (wire bytes: verified) or
`Replica.apply` (already verified). An item that would not change the replica is dropped
before its signature is checked, so duplicates cost a merge, not an Ed25519 verify: an item
we hold is known by its signature, an older record by its header, and a fact that was verified
but changed nothing (a suspicion already refuted, the fifth SUSPECT) by a bounded cache of
such facts. Measured at 128 nodes on 2 cores: half of all fact verifications while a change
spread were facts verified before that changed nothing.

GC (all on the local wall clock; `left_at` comes from the signed LEFT evidence, so replicas
agree on it up to clock skew):
1. A LEFT entry stays visible until `left_at + retention_s` (24 h). Then it is compacted into
   a tombstone `(session id -> left_at)`: it leaves the views and digests, and every later item
   about that session is ignored.
2. The tombstone itself is dropped at `left_at + retention_s + tombstone_ttl_s`.
3. Items whose own timestamp is older than `max_record_age_s` are refused at ingestion. Owners
   refresh their record at least every `refresh_interval_s` (< max_record_age_s), so a live
   session never ages out, while anything about a session whose tombstone was dropped is older
   than `retention_s + tombstone_ttl_s >= max_record_age_s` and cannot resurrect it.
   Bound: an evicted owner that stays partitioned away and keeps refreshing for longer than
   retention + tombstone TTL can reappear (as a fresh SERVING entry that SWIM then probes).
4. Items whose timestamp is not finite, or later than our wall clock + `max_clock_skew_s`
   (1 h), are refused too: a member could otherwise sign an EVICT or LEFT with
   `issued_at = inf` (or the year 3000) whose entry and tombstone would never be collected.
   The bound only delays GC by at most that much; a node whose clock runs ahead by more
   is not admitted to other replicas (counted as `future`) until its clock is fixed.

Every refusal is counted in `rejected[reason]` (`tombstoned`, `stale`, `future`,
`bad_timestamp`, `not_admitted`); pass a shared Counter to keep counting across replicas.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmfabric.clock import Clock
from llmfabric.registry.codec import SignedRecord, peek_record_header, verify_record
from llmfabric.registry.entry import Entry, entry_of, items_of, merge
from llmfabric.registry.errors import InvalidRecord, RegistryError
from llmfabric.registry.facts import Fact, verify_fact

Item = SignedRecord | Fact
ITEM_RECORD = 1
ITEM_FACT = 2
IDLE_FACTS_MAX = 4096  # ~2 MB at most per replica (measured: 4,096 facts take 1.95 MB)


@dataclass(frozen=True, slots=True)
class GcConfig:
    retention_s: float = 24 * 3600.0
    tombstone_ttl_s: float = 6 * 24 * 3600.0
    max_record_age_s: float = 3 * 24 * 3600.0
    # A refresh is a minor rumour every replica sends on `minor_transmits` times: at 10,000
    # nodes a 1 h interval alone cost ~5 KB/s per node (benchmarks/gossip_scale.py); 6 h
    # keeps it under 1 KB/s and still re-signs 12 times within max_record_age_s.
    refresh_interval_s: float = 6 * 3600.0
    # Items stamped later than our wall clock + this are refused (clock skew tolerance).
    max_clock_skew_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.max_clock_skew_s < math.inf:
            raise RegistryError("max_clock_skew_s must be a positive number of seconds")
        if self.max_record_age_s > self.retention_s + self.tombstone_ttl_s:
            raise RegistryError(
                "max_record_age_s must be <= retention_s + tombstone_ttl_s, or a dropped "
                "tombstone could be resurrected by a late item"
            )
        if self.refresh_interval_s >= self.max_record_age_s:
            raise RegistryError("refresh_interval_s must be < max_record_age_s")


@dataclass(frozen=True, slots=True)
class Change:
    """The replica's entry for `session_id` changed from `before` to `after`."""

    session_id: str
    before: Entry | None
    after: Entry


Listener = Callable[[Change], None]


def item_kind(item: Item) -> int:
    return ITEM_RECORD if isinstance(item, SignedRecord) else ITEM_FACT


def item_parts(item: Item) -> tuple[int, bytes, bytes]:
    """(kind, body, signature): the wire form of an item."""
    return (item_kind(item), item.body, item.signature)


class Replica:
    def __init__(
        self,
        clock: Clock,
        gc: GcConfig | None = None,
        *,
        buckets: int = 32,
        admit: Callable[[str], bool] | None = None,
        rejected: Counter[str] | None = None,
    ) -> None:
        if not 1 <= buckets <= 256:
            raise RegistryError("buckets must be in 1..256")
        self._clock = clock
        self.gc_config = gc or GcConfig()
        self.nbuckets = buckets
        self._admit = admit
        self.entries: dict[str, Entry] = {}
        self.tombstones: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        self._digests: dict[str, bytes] = {}
        self._bucket_xor = [0] * buckets
        self._listeners: list[Listener] = []
        # Refusals by reason; a Counter passed in keeps counting across replicas (a node that
        # rejoins under a new session gets a new replica, its metrics must not reset).
        self.rejected: Counter[str] = rejected if rejected is not None else Counter()
        self._sigs: set[bytes] = set()  # signatures of every item held in `entries`
        # Facts verified that changed nothing, by signature (LRU): merged again unverified.
        self._idle_facts: OrderedDict[bytes, Fact] = OrderedDict()
        self.applied = 0

    # ---- listeners ----------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    # ---- ingestion ----------------------------------------------------------------------
    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def _gate(self, item: Item) -> bool:
        sid = item.session_id
        if sid in self.tombstones:
            self._reject("tombstoned")
            return False
        stamp = item.record.updated_at if isinstance(item, SignedRecord) else item.issued_at
        if not math.isfinite(stamp):
            self._reject("bad_timestamp")
            return False
        wall = self._clock.wall()
        if stamp < wall - self.gc_config.max_record_age_s:
            self._reject("stale")
            return False
        if stamp > wall + self.gc_config.max_clock_skew_s:
            self._reject("future")
            return False
        who = item.record.peer_id if isinstance(item, SignedRecord) else item.author
        if self._admit is not None and not self._admit(who):
            self._reject("not_admitted")
            return False
        return True

    def _candidate(self, item: Item) -> tuple[Entry | None, Entry]:
        cur = self.entries.get(item.session_id)
        one = entry_of(item)
        return cur, (merge(cur, one) if cur is not None else one)

    def apply(self, item: Item) -> Change | None:
        """Merge an already verified item; return the change, or None if nothing changed."""
        if not self._gate(item):
            return None
        cur, new = self._candidate(item)
        if new == cur:
            return None
        return self._store(cur, new)

    def ingest(self, kind: int, body: bytes, signature: bytes) -> Change | None:
        """Verify and merge an item in wire form. Raises InvalidRecord if it is forged."""
        if signature in self._sigs:
            return None  # an item we hold already (a different body cannot carry its signature)
        if kind == ITEM_FACT:
            fact = self._idle_facts.pop(signature, None)
            if fact is None or fact.body != body:
                fact = verify_fact(body, signature)
            change = self.apply(fact)  # a fact that did not matter before may matter now
            if change is None:  # remember it, most recent last: no verify next time
                self._idle_facts[signature] = fact
                if len(self._idle_facts) > IDLE_FACTS_MAX:
                    self._idle_facts.popitem(last=False)
            return change
        if kind != ITEM_RECORD:
            raise InvalidRecord("schema", f"unknown item kind {kind}")
        sid, order = peek_record_header(body)  # decide whether it matters before verifying
        cur = self.entries.get(sid)
        if cur is not None and cur.record is not None and (order, signature) < (
                cur.record.record.order_key(), cur.record.signature):
            return None  # older than what we have: merge would ignore it
        return self.apply(verify_record(body, signature))

    def _store(self, before: Entry | None, after: Entry) -> Change | None:
        sid = after.session_id
        left_at = after.left_at()
        if left_at is not None and self._clock.wall() > left_at + self.gc_config.retention_s:
            self._drop(sid)
            self.tombstones[sid] = left_at
            return None
        self._set_digest(sid, after.digest())
        if before is not None:
            self._sigs.difference_update(it.signature for it in items_of(before))
        self._sigs.update(it.signature for it in items_of(after))
        self.entries[sid] = after
        self.last_seen[sid] = self._clock.now()
        self.applied += 1
        change = Change(sid, before, after)
        for listener in list(self._listeners):
            listener(change)
        return change

    # ---- digests ------------------------------------------------------------------------
    def bucket_of(self, session_id: str) -> int:
        return zlib.crc32(session_id.encode()) % self.nbuckets

    def _set_digest(self, sid: str, digest: bytes | None) -> None:
        b = self.bucket_of(sid)
        old = self._digests.pop(sid, None)
        if old is not None:
            self._bucket_xor[b] ^= int.from_bytes(old, "big")
        if digest is not None:
            self._digests[sid] = digest
            self._bucket_xor[b] ^= int.from_bytes(digest, "big")

    def bucket_hashes(self) -> list[int]:
        return list(self._bucket_xor)

    def root(self) -> int:
        h = zlib.crc32(b"".join(x.to_bytes(8, "big") for x in self._bucket_xor))
        return (h << 32) | (len(self._digests) & 0xFFFFFFFF)

    def digests_in(self, buckets: Iterable[int]) -> dict[str, bytes]:
        want = set(buckets)
        return {s: d for s, d in self._digests.items() if self.bucket_of(s) in want}

    def digest(self, session_id: str) -> bytes | None:
        return self._digests.get(session_id)

    def knows(self, session_id: str) -> bool:
        return session_id in self.entries or session_id in self.tombstones

    # ---- GC -----------------------------------------------------------------------------
    def _drop(self, sid: str) -> None:
        self._set_digest(sid, None)
        old = self.entries.pop(sid, None)
        if old is not None:
            self._sigs.difference_update(it.signature for it in items_of(old))
        self.last_seen.pop(sid, None)

    def collect(self) -> int:
        """Compact LEFT entries past retention and drop expired tombstones; return #changes."""
        wall = self._clock.wall()
        g = self.gc_config
        n = 0
        for sid, entry in list(self.entries.items()):
            left_at = entry.left_at()
            if left_at is not None and wall > left_at + g.retention_s:
                self._drop(sid)
                self.tombstones[sid] = left_at
                n += 1
        for sid, left_at in list(self.tombstones.items()):
            if wall > left_at + g.retention_s + g.tombstone_ttl_s:
                del self.tombstones[sid]
                n += 1
        return n
