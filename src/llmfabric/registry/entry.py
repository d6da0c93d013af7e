"""One G-Map value and its join: owner record + third-party facts about one session.

State of a session on a replica (`Entry`):
- `record`: the owner's highest signed record, ordered by (lifecycle, incarnation, version),
  ties (only possible if the owner equivocates) broken by signature bytes;
- `newest`: the owner's record with the highest incarnation, kept only when it is not `record`
  (an owner that published a higher incarnation at a lower lifecycle);
- `suspects`: per author, its highest SUSPECT fact; only facts with incarnation >= the highest
  incarnation of any owner record seen (`refuted_below`) count (lower ones are refuted and
  dropped);
- `evicts`: EVICT facts, one per (author, incarnation), with incarnation >= `refuted_below`:
  the evidence for an eviction (refuted like suspicions);
- `evict`: the EVICT fact that made the session LEFT on this replica, if any.

An EVICT fact alone proves nothing: any member can sign one. A session is evicted only when
EVICT facts of one incarnation come from at least `quorum` distinct authors, or when one of
them is signed by the owner's own key (`decisive_evict`). The quorum is a parameter of the
join (the replica passes min(k, fleet size - 1), see registry.replica); for a fixed quorum
`merge` is the join of a semilattice (commutative, associative, idempotent).

An eviction is a verdict about one incarnation, as a suspicion is (memberlist's rule for a
dead member that comes back): a record of the owner at a higher incarnation refutes it, drops
its evidence, and the session is live again. Only the owner can sign that record, and an
honest owner does so exactly when it is alive and hears of its own eviction (a false positive:
a partition, a pause), so it keeps its session instead of rejoining under a new one. Refuted
evidence never counts again: without that, EVICT facts about an incarnation the owner had
long refuted became decisive whenever the fleet shrank and the quorum cap fell with it, and
one departure after a partition evicted every session in cascade (registry.replica
`_requorum`). While not refuted, a decided `evict` is kept whatever arrives later, and the
entry's digest no longer depends on which EVICT facts a replica holds. A LEFT record (the
owner left) is final. Normalisation (dropping refuted suspicions and EVICT facts, and all
suspicions once the owner's record is LEFT) commutes with the join because the highest
record incarnation seen and the record order only ever grow.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

from llmfabric.registry.codec import SignedRecord
from llmfabric.registry.errors import RegistryError
from llmfabric.registry.facts import Fact, FactKind
from llmfabric.registry.records import Lifecycle


@dataclass(frozen=True, slots=True)
class Entry:
    session_id: str
    record: SignedRecord | None = None
    suspects: tuple[Fact, ...] = ()  # sorted by author, one per author, all unrefuted
    evict: Fact | None = None  # the decisive EVICT (quorum reached or the owner's own)
    evicts: tuple[Fact, ...] = ()  # sorted by author, one per author (the evidence)
    # The owner's record with the highest incarnation, when that is not `record` (an owner that
    # published a higher incarnation at a lower lifecycle): it refutes suspicions as well.
    newest: SignedRecord | None = None

    @property
    def state(self) -> Lifecycle:
        if self.evict is not None:
            return Lifecycle.LEFT
        return self.record.record.state if self.record is not None else Lifecycle.JOIN

    @property
    def incarnation(self) -> int:
        return self.record.record.incarnation if self.record is not None else 0

    @property
    def refuted_below(self) -> int:
        """Suspicions below this incarnation are refuted: the highest incarnation of any owner
        record seen. It only grows, whatever order records arrive in (the record order puts
        lifecycle first, so `incarnation` alone can fall back)."""
        top = self.newest if self.newest is not None else self.record
        return top.record.incarnation if top is not None else 0

    @property
    def suspected(self) -> bool:
        """An unrefuted suspicion of a session that is not evicted (an evicted entry keeps its
        suspicions, which its refutation may need, but is LEFT rather than suspected)."""
        return bool(self.suspects) and self.evict is None

    @property
    def evicted(self) -> bool:
        return self.evict is not None

    @property
    def max_suspect_incarnation(self) -> int:
        return max((f.incarnation for f in self.suspects), default=-1)

    def left_at(self) -> float | None:
        """Wall time at which the session became LEFT, from the signed evidence; None if not.

        An EVICT's time is its author's claim, so an eviction counts from no earlier than the
        owner's newest record we hold: a member backdating its EVICT by days (stamps are
        accepted up to `max_record_age_s` old) would otherwise make the decided eviction
        older than the retention at once, and the session would be compacted into a
        tombstone before its owner could refute it (and refused for days after)."""
        times = []
        if self.evict is not None:
            times.append(max([self.evict.issued_at] + [
                r.record.updated_at for r in (self.record, self.newest) if r is not None]))
        if self.record is not None and self.record.record.state is Lifecycle.LEFT:
            times.append(self.record.record.updated_at)
        return min(times) if times else None

    def evict_authors(self, incarnation: int) -> int:
        """Distinct authors of EVICT facts at `incarnation`."""
        return sum(1 for f in self.evicts if f.incarnation == incarnation)

    def digest(self) -> bytes:
        """8-byte fingerprint of this entry's content (used by anti-entropy).

        A decided eviction is summarised (replicas that reached the quorum with different
        EVICT facts agree); undecided EVICT facts are part of the content."""
        h = hashlib.sha256(self.session_id.encode())
        h.update(self.record.signature if self.record is not None else b"-")
        if self.newest is not None:
            h.update(self.newest.signature)
        for f in self.suspects:
            h.update(f.signature)
        if self.evict is not None:
            h.update(b"evicted")
        else:
            for f in self.evicts:
                h.update(f.signature)
        return h.digest()[:8]


def decisive_evict(
    record: SignedRecord | None, evicts: dict[tuple[str, int], Fact], quorum: int
) -> Fact | None:
    """The EVICT that decides the eviction, or None: the earliest (issued_at, signature) of
    the facts signed by the owner's key or belonging to an incarnation with EVICT facts from
    at least `quorum` distinct authors. Facts only accumulate, so this is monotone: once a
    set decides, every larger set decides on the same or an earlier fact. Facts about a
    session whose record we do not hold decide nothing (we cannot tell who the owner is)."""
    if record is None or not evicts:
        return None
    key = record.record.public_key
    per_inc = Counter(inc for _, inc in evicts)
    ok = [f for f in evicts.values()
          if f.author_key == key or per_inc[f.incarnation] >= max(1, quorum)]
    return min(ok, key=lambda f: (f.issued_at, f.signature)) if ok else None


def _normalize(
    sid: str, record: SignedRecord | None, suspects: dict[str, Fact], evict: Fact | None,
    evicts: dict[tuple[str, int], Fact], quorum: int, newest: SignedRecord | None = None,
) -> Entry:
    # Refutation drops suspicions below the highest incarnation of ANY record seen, a
    # quantity that only grows, so dropping commutes with the join (with the best record's
    # incarnation it did not: a higher lifecycle at a lower incarnation could replace it).
    newest = _newest_record(record, newest)
    inc = newest.record.incarnation if newest is not None else 0
    # EVICT facts are evidence against one incarnation: the owner's higher incarnation
    # refutes them exactly as it refutes suspicions (and a decided eviction with them).
    evicts = {k: f for k, f in evicts.items() if f.incarnation >= inc}
    if evict is not None and evict.incarnation < inc:
        evict = None
    evict = _best_evict(evict, decisive_evict(record, evicts, quorum))
    # Suspicions go once the owner left (final); an eviction can still be refuted, and
    # dropping them while evicted would make the result depend on delivery order.
    if record is not None and record.record.state is Lifecycle.LEFT:
        kept: tuple[Fact, ...] = ()
    else:
        kept = tuple(suspects[a] for a in sorted(suspects) if suspects[a].incarnation >= inc)
    return Entry(sid, record, kept, evict, tuple(evicts[k] for k in sorted(evicts)),
                 None if newest is None or record is None
                 or newest.signature == record.signature else newest)


def _newest_record(a: SignedRecord | None, b: SignedRecord | None) -> SignedRecord | None:
    """The record with the highest (incarnation, merge order, signature): a join as well."""
    if a is None:
        return b
    if b is None:
        return a
    ka = (a.record.incarnation, a.record.order_key(), a.signature)
    kb = (b.record.incarnation, b.record.order_key(), b.signature)
    return a if ka >= kb else b


def _best_record(a: SignedRecord | None, b: SignedRecord | None) -> SignedRecord | None:
    if a is None:
        return b
    if b is None:
        return a
    ka = (a.record.order_key(), a.signature)
    kb = (b.record.order_key(), b.signature)
    return a if ka >= kb else b


def _best_evict(a: Fact | None, b: Fact | None) -> Fact | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if (a.issued_at, a.signature) <= (b.issued_at, b.signature) else b


def _evict_set(a: tuple[Fact, ...], b: tuple[Fact, ...]) -> dict[tuple[str, int], Fact]:
    out = {(f.author, f.incarnation): f for f in a}
    for f in b:
        cur = out.get((f.author, f.incarnation))
        # the earliest per key: what decisive_evict would pick, so decisions commute
        if cur is None or (f.issued_at, f.signature) < (cur.issued_at, cur.signature):
            out[(f.author, f.incarnation)] = f
    return out


def _per_author(a: tuple[Fact, ...], b: tuple[Fact, ...]) -> dict[str, Fact]:
    out = {f.author: f for f in a}
    for f in b:
        cur = out.get(f.author)
        if cur is None or f.order_key() > cur.order_key():
            out[f.author] = f
    return out


def merge(a: Entry, b: Entry, *, quorum: int = 1) -> Entry:
    """The join of two entries of the same session; an eviction needs `quorum` authors."""
    if a.session_id != b.session_id:
        raise RegistryError(f"cannot merge sessions {a.session_id} and {b.session_id}")
    if a == b:
        return a
    return _normalize(
        a.session_id,
        _best_record(a.record, b.record),
        _per_author(a.suspects, b.suspects),
        _best_evict(a.evict, b.evict),
        _evict_set(a.evicts, b.evicts),
        quorum,
        _newest_record(_newest_record(a.record, a.newest), _newest_record(b.record, b.newest)),
    )


def entry_of(item: SignedRecord | Fact, *, quorum: int = 1) -> Entry:
    """The smallest entry holding one record or fact."""
    if isinstance(item, SignedRecord):
        return _normalize(item.session_id, item, {}, None, {}, quorum)
    if item.kind is FactKind.EVICT:
        return Entry(item.session_id, None, (), None, (item,))  # decides nothing alone
    return _normalize(item.session_id, None, {item.author: item}, None, {}, quorum)


def reconsider(entry: Entry, *, quorum: int) -> Entry:
    """`entry` normalised again under `quorum` (the replica's quorum dropped: the fleet
    shrank, and pending EVICT facts may now be enough)."""
    if entry.evict is not None or not entry.evicts:
        return entry
    return _normalize(entry.session_id, entry.record, {f.author: f for f in entry.suspects},
                      None, {(f.author, f.incarnation): f for f in entry.evicts}, quorum,
                      entry.newest)


def items_of(entry: Entry) -> list[SignedRecord | Fact]:
    """The signed items an entry is made of (what a peer needs to rebuild it)."""
    out: list[SignedRecord | Fact] = []
    if entry.record is not None:
        out.append(entry.record)
    if entry.newest is not None:
        out.append(entry.newest)
    out.extend(entry.suspects)
    out.extend(entry.evicts)
    if entry.evict is not None and entry.evict not in entry.evicts:
        out.append(entry.evict)
    return out
