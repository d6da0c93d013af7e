"""The local replica of the G-Map: verified ingestion, merge, bucketed digests and GC.

Every item (signed record or fact) goes through `Replica.ingest` (wire bytes: verified) or
`Replica.apply` (already verified). An item that would not change the replica is dropped
before its signature is checked, so duplicates cost a merge, not an Ed25519 verify: an item
we hold is known by its signature, an older record by its header, and a fact that was verified
but changed nothing (a suspicion already refuted, the fifth SUSPECT) by a bounded cache of
such facts. Measured at 128 nodes on 2 cores: half of all fact verifications while a change
spread were facts verified before that changed nothing.

GC (all on the local wall clock; `left_at` comes from the signed LEFT evidence, an EVICT's
from no earlier than the owner's newest record, so replicas agree on it up to clock skew):
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

Storage: the per-session maps are plain dicts and sets on a real node. A simulation of many
replicas that start converged freezes one replica (`freeze()`: a read-only `ReplicaBase`) and
has every other replica `adopt()` it: their maps become copy-on-write (registry.cow) over the
shared base, so each replica holds only what changed since. Nothing here is O(sessions) per
change: the live-peer count, the per-bucket session index and the set of LEFT entries (what
GC can compact) are kept incrementally.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, MutableMapping, MutableSet
from dataclasses import dataclass
from types import MappingProxyType

from llmfabric.clock import Clock
from llmfabric.registry.codec import SignedRecord, peek_record_header, verify_record
from llmfabric.registry.cow import CowDict, CowSet
from llmfabric.registry.entry import Entry, entry_of, items_of, merge, reconsider
from llmfabric.registry.errors import InvalidRecord, RegistryError
from llmfabric.registry.facts import Fact, FactKind, verify_fact
from llmfabric.registry.guard import AuthorLimiter, RecordPolicy, TrustConfig
from llmfabric.registry.records import Lifecycle

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


@dataclass(frozen=True, slots=True)
class ReplicaBase:
    """A read-only snapshot of a replica's state, shared by the replicas that adopt it."""

    entries: Mapping[str, Entry]
    last_seen: Mapping[str, float]
    digests: Mapping[str, bytes]
    sigs: frozenset[bytes]
    sessions_of: Mapping[str, frozenset[str]]
    in_bucket: tuple[frozenset[str], ...]
    bucket_xor: tuple[int, ...]
    left: Mapping[str, float]
    live_peers: int
    applied: int
    evicted: frozenset[str]  # sessions evicted (not left by their owner)


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
        trust: TrustConfig | None = None,
        policy: RecordPolicy | None = None,
        own_peer: str | None = None,
    ) -> None:
        if not 1 <= buckets <= 256:
            raise RegistryError("buckets must be in 1..256")
        self._clock = clock
        self.gc_config = gc or GcConfig()
        self.nbuckets = buckets
        self._admit = admit
        self.trust = trust or TrustConfig()
        self._policy = policy
        self._fact_limiter = AuthorLimiter(self.trust.fact_rate_per_s, self.trust.fact_burst)
        self._record_limiter = AuthorLimiter(self.trust.record_bytes_per_s,
                                             self.trust.record_burst_bytes)
        self._own_peer = own_peer  # whose records are never rate limited (our own)
        # peer id -> its sessions with a record (any state): who may author facts, and how
        # many sessions a peer holds. Values are replaced, never mutated (they may be shared).
        self._sessions_of: MutableMapping[str, frozenset[str]] = {}
        self._live_peers = 0  # peers with a non-LEFT session, kept incrementally
        self._live_changed = False  # since the last _requorum
        self._quorum = self.trust.eviction_quorum  # the quorum decisions were last made with
        self.entries: MutableMapping[str, Entry] = {}
        self.tombstones: dict[str, float] = {}
        self.last_seen: MutableMapping[str, float] = {}
        self._digests: MutableMapping[str, bytes] = {}
        self._in_bucket: list[MutableSet[str]] = [set() for _ in range(buckets)]
        self._bucket_xor = [0] * buckets
        self._left: MutableMapping[str, float] = {}  # LEFT entries -> left_at: what GC visits
        self._listeners: list[Listener] = []
        # Refusals by reason; a Counter passed in keeps counting across replicas (a node that
        # rejoins under a new session gets a new replica, its metrics must not reset).
        self.rejected: Counter[str] = rejected if rejected is not None else Counter()
        self._sigs: MutableSet[bytes] = set()  # signatures of every item held in `entries`
        # Facts verified that changed nothing, by signature (LRU): merged again unverified.
        self._idle_facts: OrderedDict[bytes, Fact] = OrderedDict()
        self.applied = 0

    # ---- shared storage (simulations) -------------------------------------------------------
    def freeze(self) -> ReplicaBase:
        """A read-only copy of this replica's state that other replicas can `adopt()`."""
        return ReplicaBase(
            MappingProxyType(dict(self.entries)), MappingProxyType(dict(self.last_seen)),
            MappingProxyType(dict(self._digests)), frozenset(self._sigs),
            MappingProxyType({p: frozenset(s) for p, s in self._sessions_of.items()}),
            tuple(frozenset(b) for b in self._in_bucket), tuple(self._bucket_xor),
            MappingProxyType(dict(self._left)), self._live_peers, self.applied,
            frozenset(sid for sid, e in self.entries.items() if e.evict is not None
                      and e.record is not None and e.record.record.state is not Lifecycle.LEFT))

    def adopt(self, base: ReplicaBase) -> None:
        """Start from `base` (same buckets): this replica's maps become copy-on-write views
        over it, holding only this replica's own changes. Call before any other use."""
        if len(base.bucket_xor) != self.nbuckets:
            raise RegistryError("the base was built with a different number of buckets")
        self.entries = CowDict(base.entries)
        self.last_seen = CowDict(base.last_seen)
        self._digests = CowDict(base.digests)
        self._sigs = CowSet(base.sigs)
        self._sessions_of = CowDict(base.sessions_of)
        self._in_bucket = [CowSet(b) for b in base.in_bucket]
        self._bucket_xor = list(base.bucket_xor)
        self._left = CowDict(base.left)
        self._live_peers = base.live_peers
        self.applied = base.applied

    def peer_sessions(self, peer_id: str) -> frozenset[str]:
        """The sessions of `peer_id` that we hold a record of (any state)."""
        return self._sessions_of.get(peer_id, frozenset())

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
        reason = (self._record_refusal(item, wall) if isinstance(item, SignedRecord)
                  else self._fact_refusal(item))
        if reason is not None:
            self._reject(reason)
            return False
        return True

    def _record_refusal(self, item: SignedRecord, wall: float) -> str | None:
        rec = item.record
        if self._policy is not None:
            reason = self._policy.refuse(rec, wall)
            if reason is not None:
                return reason
        if item.session_id in self.entries:
            return None
        if len(self._sessions_of.get(rec.peer_id, ())) >= self.trust.max_held_sessions_per_peer:
            return "sessions_held"
        if rec.state is Lifecycle.LEFT:
            return None
        cap = self.trust.max_sessions_per_peer
        if self._policy is not None:
            cap = min(cap, self._policy.max_sessions(rec) or cap)
        live = sum(1 for sid in self._sessions_of.get(rec.peer_id, ())
                   if self.entries[sid].state is not Lifecycle.LEFT)
        return "sessions_per_peer" if live >= cap else None

    def _fact_refusal(self, fact: Fact) -> str | None:
        cur = self.entries.get(fact.session_id)
        if cur is None or cur.record is None:
            return "unknown_session"  # facts never create entries
        if fact.author not in self._sessions_of:
            return "unknown_author"
        if fact.incarnation > cur.incarnation + 1:
            return "incarnation"
        if fact.kind is FactKind.EVICT and len(cur.evicts) >= self.trust.max_evicts_per_entry:
            return "too_many_facts"
        return None

    # ---- eviction quorum ----------------------------------------------------------------
    def live_peers(self) -> int:
        """Distinct peers holding a session that is not LEFT (kept incrementally)."""
        return self._live_peers

    def _peer_live(self, peer: str) -> bool:
        return any(self.entries[s].state is not Lifecycle.LEFT
                   for s in self._sessions_of.get(peer, ()))

    def quorum(self) -> int:
        return self.trust.quorum_for(self.live_peers())

    def _requorum(self) -> None:
        """The fleet shrank below k + 1 peers: pending evictions may have enough authors now
        (without this, the order in which replicas saw facts and departures would matter)."""
        q = self.quorum()
        if q >= self._quorum:
            self._quorum = q
            return
        self._quorum = q
        for e in list(self.entries.values()):
            if e.evicts and e.evict is None:
                new = reconsider(e, quorum=q)
                if new != e:
                    self._store(e, new)
        if self._live_changed:  # those evictions shrank the fleet again
            self._live_changed = False
            self._requorum()

    def _candidate(self, item: Item) -> tuple[Entry | None, Entry]:
        cur = self.entries.get(item.session_id)
        q = self.quorum()
        one = entry_of(item, quorum=q)
        return cur, (merge(cur, one, quorum=q) if cur is not None else one)

    def apply(self, item: Item) -> Change | None:
        """Merge an already verified item; return the change, or None if nothing changed."""
        if not self._gate(item):
            return None
        cur, new = self._candidate(item)
        if new == cur:
            return None
        # Only what changes an entry costs tokens, not re-deliveries.
        if isinstance(item, Fact) and not self._fact_limiter.allow(item.author,
                                                                    self._clock.now()):
            self._reject("rate_limited")
            return None
        if (isinstance(item, SignedRecord) and item.record.peer_id != self._own_peer
                and not self._record_limiter.allow(item.record.peer_id, self._clock.now(),
                                                   len(item.body))):
            self._reject("record_rate_limited")
            return None
        change = self._store(cur, new)
        if self._live_changed:
            self._live_changed = False
            self._requorum()
        return change

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
        peer = _peer_of(before, after)
        was_live = peer is not None and self._peer_live(peer)
        self._set_digest(sid, after.digest())
        if before is not None:
            for it in items_of(before):
                self._sigs.discard(it.signature)
        for it in items_of(after):
            self._sigs.add(it.signature)
        self.entries[sid] = after
        if left_at is not None:
            self._left[sid] = left_at
        elif sid in self._left:
            del self._left[sid]
        self._index(before, after, peer, was_live)
        self.last_seen[sid] = self._clock.now()
        self.applied += 1
        change = Change(sid, before, after)
        for listener in list(self._listeners):
            listener(change)
        return change

    def _index(self, before: Entry | None, after: Entry | None, peer: str | None,
               was_live: bool) -> None:
        """Keep `_sessions_of` and the live-peer count in step with `entries` (already
        updated); `was_live`: whether `peer` had a non-LEFT session before the change."""
        if peer is None:
            return
        sids = self._sessions_of.get(peer, frozenset())
        if after is not None and after.record is not None:
            if after.session_id not in sids:
                self._sessions_of[peer] = sids | {after.session_id}
        elif before is not None and before.session_id in sids:
            rest = sids - {before.session_id}
            if rest:
                self._sessions_of[peer] = rest
            else:
                del self._sessions_of[peer]
        live = self._peer_live(peer)
        if live != was_live:
            self._live_peers += 1 if live else -1
            self._live_changed = True

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
            self._in_bucket[b].add(sid)
        else:
            self._in_bucket[b].discard(sid)

    def bucket_hashes(self) -> list[int]:
        return list(self._bucket_xor)

    def root(self) -> int:
        h = zlib.crc32(b"".join(x.to_bytes(8, "big") for x in self._bucket_xor))
        return (h << 32) | (len(self._digests) & 0xFFFFFFFF)

    def digests_in(self, buckets: Iterable[int]) -> dict[str, bytes]:
        """(session id -> digest) of the sessions in these buckets: O(sessions in them)."""
        out: dict[str, bytes] = {}
        for b in sorted(set(buckets)):
            if 0 <= b < self.nbuckets:
                for sid in self._in_bucket[b]:
                    out[sid] = self._digests[sid]
        return out

    def digest(self, session_id: str) -> bytes | None:
        return self._digests.get(session_id)

    def knows(self, session_id: str) -> bool:
        return session_id in self.entries or session_id in self.tombstones

    def purge_peer(self, peer_id: str, sessions: Iterable[str] | None = None) -> list[str]:
        """Drop every session of `peer_id` now (or only those of them in `sessions`), as
        tombstones (its membership, or the certificate those sessions carry, was revoked):
        they leave the views and digests, anti-entropy never asks for them again and later
        items about them are ignored; new sessions of the key are the record policy's to
        refuse. Listeners are told each session is now known as nothing (`Entry(sid)`, no
        record), so followers such as the routing index drop its candidates. Returns the
        sessions dropped."""
        held = self._sessions_of.get(peer_id, frozenset())
        sids = sorted(held if sessions is None else held.intersection(sessions))
        wall = self._clock.wall()
        changes = []
        for sid in sids:
            changes.append(Change(sid, self.entries.get(sid), Entry(sid)))
            self._drop(sid)
            self.tombstones[sid] = wall  # (collected at wall + retention + tombstone TTL)
        if self._live_changed:
            self._live_changed = False
            self._requorum()
        for change in changes:
            for listener in list(self._listeners):
                listener(change)
        return sids

    # ---- GC -----------------------------------------------------------------------------
    def _drop(self, sid: str) -> None:
        old = self.entries.get(sid)
        peer = _peer_of(old, None)
        was_live = peer is not None and self._peer_live(peer)
        self._set_digest(sid, None)
        self.entries.pop(sid, None)
        if old is not None:
            for it in items_of(old):
                self._sigs.discard(it.signature)
            self._index(old, None, peer, was_live)
        self.last_seen.pop(sid, None)
        self._left.pop(sid, None)

    def collect(self) -> int:
        """Compact LEFT entries past retention and drop expired tombstones; return #changes."""
        wall = self._clock.wall()
        g = self.gc_config
        n = 0
        for sid, left_at in list(self._left.items()):  # only LEFT entries can be compacted
            if wall > left_at + g.retention_s:
                self._drop(sid)
                self.tombstones[sid] = left_at
                n += 1
        for sid, left_at in list(self.tombstones.items()):
            if wall > left_at + g.retention_s + g.tombstone_ttl_s:
                del self.tombstones[sid]
                n += 1
        return n


def _peer_of(before: Entry | None, after: Entry | None) -> str | None:
    e = after if after is not None and after.record is not None else before
    return None if e is None or e.record is None else e.record.record.peer_id
