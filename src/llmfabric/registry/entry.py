"""One G-Map value and its join: owner record + third-party facts about one session.

State of a session on a replica (`Entry`):
- `record`: the owner's highest signed record, ordered by (lifecycle, incarnation, version),
  ties (only possible if the owner equivocates) broken by signature bytes;
- `suspects`: per author, its highest SUSPECT fact; only facts with incarnation >= the record's
  incarnation count (lower ones are refuted and dropped);
- `evict`: an EVICT fact, if any (the earliest by (issued_at, signature) is kept).

The effective lifecycle is LEFT if evicted, else the record's state. `merge` is the join of a
semilattice (commutative, associative, idempotent) and the effective lifecycle never goes back.
Normalisation (dropping refuted suspicions, and all suspicions once LEFT) commutes with the
join because the record incarnation and LEFT only ever grow.
"""

from __future__ import annotations

import hashlib
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
    evict: Fact | None = None

    @property
    def state(self) -> Lifecycle:
        if self.evict is not None:
            return Lifecycle.LEFT
        return self.record.record.state if self.record is not None else Lifecycle.JOIN

    @property
    def incarnation(self) -> int:
        return self.record.record.incarnation if self.record is not None else 0

    @property
    def suspected(self) -> bool:
        return bool(self.suspects)

    @property
    def evicted(self) -> bool:
        return self.evict is not None

    @property
    def max_suspect_incarnation(self) -> int:
        return max((f.incarnation for f in self.suspects), default=-1)

    def left_at(self) -> float | None:
        """Wall time at which the session became LEFT, from the signed evidence; None if not."""
        times = []
        if self.evict is not None:
            times.append(self.evict.issued_at)
        if self.record is not None and self.record.record.state is Lifecycle.LEFT:
            times.append(self.record.record.updated_at)
        return min(times) if times else None

    def digest(self) -> bytes:
        """8-byte fingerprint of this entry's content (used by anti-entropy)."""
        h = hashlib.sha256(self.session_id.encode())
        h.update(self.record.signature if self.record is not None else b"-")
        for f in self.suspects:
            h.update(f.signature)
        h.update(self.evict.signature if self.evict is not None else b"-")
        return h.digest()[:8]


def _normalize(
    sid: str, record: SignedRecord | None, suspects: dict[str, Fact], evict: Fact | None
) -> Entry:
    left = evict is not None or (record is not None and record.record.state is Lifecycle.LEFT)
    if left:
        kept: tuple[Fact, ...] = ()
    else:
        inc = record.record.incarnation if record is not None else 0
        kept = tuple(suspects[a] for a in sorted(suspects) if suspects[a].incarnation >= inc)
    return Entry(sid, record, kept, evict)


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


def merge(a: Entry, b: Entry) -> Entry:
    """The join of two entries of the same session."""
    if a.session_id != b.session_id:
        raise RegistryError(f"cannot merge sessions {a.session_id} and {b.session_id}")
    if a == b:
        return a
    suspects = {f.author: f for f in a.suspects}
    for f in b.suspects:
        cur = suspects.get(f.author)
        if cur is None or f.order_key() > cur.order_key():
            suspects[f.author] = f
    return _normalize(
        a.session_id,
        _best_record(a.record, b.record),
        suspects,
        _best_evict(a.evict, b.evict),
    )


def entry_of(item: SignedRecord | Fact) -> Entry:
    """The smallest entry holding one record or fact."""
    if isinstance(item, SignedRecord):
        return _normalize(item.session_id, item, {}, None)
    if item.kind is FactKind.EVICT:
        return Entry(item.session_id, None, (), item)
    return _normalize(item.session_id, None, {item.author: item}, None)


def items_of(entry: Entry) -> list[SignedRecord | Fact]:
    """The signed items an entry is made of (what a peer needs to rebuild it)."""
    out: list[SignedRecord | Fact] = []
    if entry.record is not None:
        out.append(entry.record)
    out.extend(entry.suspects)
    if entry.evict is not None:
        out.append(entry.evict)
    return out
