"""The routing index: model id/alias -> routable candidates, updated per session change.

`CandidateIndex.update(session_id, record, suspected)` costs O(names the session announces *
log(bucket size)) plus a memmove in the buckets it leaves or enters; nothing is rebuilt. A
change that leaves a session's candidates equal (a record refresh, a fact that changes no
routing input) touches no bucket; a load hint replaces the candidate in place in each of its
buckets. Buckets stay sorted by session id, so the index equals `candidates_by_model` over
the same records (sorted by session id), order included: a property test checks exactly that.

`candidates(name)` returns an immutable snapshot of one bucket, cached until that bucket
changes (callers may hold it across awaits, e.g. the ingress's retry loop).
`record` is the record with its *effective* lifecycle (LEFT once evicted, as
registry.views.view_of gives it) or None when the session is gone.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.routing.candidates import Candidate, routable


def _contributions(record: NodeRecord, suspected: bool) -> dict[str, Candidate]:
    """name -> candidate of one session; the first served model claiming a name wins."""
    out: dict[str, Candidate] = {}
    if not routable(record, suspected):
        return out
    for served in record.meta.models:
        cand: Candidate | None = None
        for name in (served.id, *served.aliases):
            if name not in out:
                cand = cand or Candidate.from_record(record, served, suspected)
                out[name] = cand
    return out


def _announced(record: NodeRecord) -> frozenset[str]:
    if record.state is Lifecycle.LEFT:
        return frozenset()
    return frozenset(n for m in record.meta.models for n in (m.id, *m.aliases))


class CandidateIndex:
    def __init__(self) -> None:
        self._buckets: dict[str, list[Candidate]] = {}  # name -> candidates by session id
        self._keys: dict[str, list[str]] = {}  # name -> the buckets' session ids (bisect)
        self._views: dict[str, tuple[Candidate, ...]] = {}  # cached snapshots of buckets
        self._of_session: dict[str, dict[str, Candidate]] = {}  # sid -> name -> candidate
        self._announced: dict[str, frozenset[str]] = {}  # sid -> names (non-LEFT sessions)
        self._known: Counter[str] = Counter()  # name -> non-LEFT sessions announcing it
        self.changes = 0  # bucket edits made (for tests and benchmarks)

    @classmethod
    def from_records(cls, records_with_suspicion: Iterable[tuple[NodeRecord, bool]]
                     ) -> CandidateIndex:
        index = cls()
        for record, suspected in records_with_suspicion:
            index.update(record.session_id, record, suspected)
        return index

    # ---- reads --------------------------------------------------------------------------
    def candidates(self, name: str) -> Sequence[Candidate]:
        view = self._views.get(name)
        if view is None:
            view = tuple(self._buckets.get(name, ()))
            if view:
                self._views[name] = view
        return view

    def is_known(self, name: str) -> bool:
        """Whether any non-LEFT session announces `name` (routable or not)."""
        return self._known[name] > 0

    def all_candidates(self) -> list[Candidate]:
        """Every routable candidate once per (session, model id)."""
        out: list[Candidate] = []
        for per_name in self._of_session.values():
            seen: set[str] = set()
            for cand in per_name.values():
                if cand.model.id not in seen:
                    seen.add(cand.model.id)
                    out.append(cand)
        return out

    def names(self) -> list[str]:
        return sorted(self._buckets)

    def __len__(self) -> int:
        """Routable sessions."""
        return len(self._of_session)

    # ---- writes -------------------------------------------------------------------------
    def update(self, session_id: str, record: NodeRecord | None, suspected: bool = False) -> None:
        """Bring one session up to date; `record` None removes it."""
        names = _announced(record) if record is not None else frozenset()
        old_names = self._announced.get(session_id, frozenset())
        if names != old_names:
            self._known.subtract(old_names)
            self._known.update(names)
            for n in old_names - names:
                if self._known[n] <= 0:
                    del self._known[n]
            if names:
                self._announced[session_id] = names
            else:
                self._announced.pop(session_id, None)
        new = _contributions(record, suspected) if record is not None else {}
        old = self._of_session.pop(session_id, {})
        for name in old.keys() - new.keys():
            self._remove(name, session_id)
        for name, cand in new.items():
            prev = old.get(name)
            if prev is None:
                self._insert(name, session_id, cand)
            elif prev != cand:
                self._replace(name, session_id, cand)
        if new:
            self._of_session[session_id] = new

    def remove(self, session_id: str) -> None:
        self.update(session_id, None)

    def _insert(self, name: str, sid: str, cand: Candidate) -> None:
        keys = self._keys.setdefault(name, [])
        i = bisect_left(keys, sid)
        keys.insert(i, sid)
        self._buckets.setdefault(name, []).insert(i, cand)
        self._views.pop(name, None)
        self.changes += 1

    def _replace(self, name: str, sid: str, cand: Candidate) -> None:
        i = bisect_left(self._keys[name], sid)
        self._buckets[name][i] = cand
        self._views.pop(name, None)
        self.changes += 1

    def _remove(self, name: str, sid: str) -> None:
        keys = self._keys[name]
        i = bisect_left(keys, sid)
        del keys[i]
        del self._buckets[name][i]
        if not keys:
            del self._keys[name], self._buckets[name]
        self._views.pop(name, None)
        self.changes += 1
