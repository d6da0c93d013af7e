"""The routing index: model id/alias -> candidates (SERVING sessions; suspected ones flagged,
for the Router's fallback: routing.candidates.listed), updated per session change.

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

Provider identities come from `identify(record)` (routing.candidates.Identify). A candidate
listed under an alias that is another provider's model id is flagged (`alias_conflict`), as
in `candidates_by_model`: the index keeps, per model id, how many non-LEFT sessions of each
provider serve it, and re-flags one bucket only when that set of providers changes.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.routing.candidates import Candidate, Identify, claimed_provider, listed


def _announced(record: NodeRecord) -> frozenset[str]:
    if record.state is Lifecycle.LEFT:
        return frozenset()
    return frozenset(n for m in record.meta.models for n in m.names())


class CandidateIndex:
    def __init__(self, identify: Identify = claimed_provider) -> None:
        self._identify = identify
        self._owners: dict[str, Counter[str]] = {}  # model id -> provider -> sessions
        self._owns: dict[str, tuple[str, frozenset[str]]] = {}  # sid -> (provider, model ids)
        self._buckets: dict[str, list[Candidate]] = {}  # name -> candidates by session id
        self._keys: dict[str, list[str]] = {}  # name -> the buckets' session ids (bisect)
        self._views: dict[str, tuple[Candidate, ...]] = {}  # cached snapshots of buckets
        self._of_session: dict[str, dict[str, Candidate]] = {}  # sid -> name -> candidate
        self._announced: dict[str, frozenset[str]] = {}  # sid -> names (non-LEFT sessions)
        self._known: Counter[str] = Counter()  # name -> non-LEFT sessions announcing it
        self.changes = 0  # bucket edits made (for tests and benchmarks)

    @classmethod
    def from_records(cls, records_with_suspicion: Iterable[tuple[NodeRecord, bool]],
                     identify: Identify = claimed_provider) -> CandidateIndex:
        index = cls(identify)
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
        """Every candidate once per (session, model id)."""
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
        """Sessions with candidates (SERVING, suspected or not)."""
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
        who = self._identify(record) if record is not None else ""
        reflag = self._update_owners(session_id, who, record)
        new = self._contributions(record, suspected, who) if record is not None else {}
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
        for name in reflag:
            self._reflag(name)

    def _update_owners(self, sid: str, who: str, record: NodeRecord | None) -> list[str]:
        """Count the session under the model ids it serves (non-LEFT); return the ids whose
        set of providers changed."""
        ids = (frozenset(m.id for m in record.meta.models)
               if record is not None and record.state is not Lifecycle.LEFT else frozenset())
        old_who, old_ids = self._owns.get(sid, ("", frozenset()))
        if (old_who, old_ids) == (who, ids):
            return []
        changed = []
        for mid in old_ids:
            owners = self._owners[mid]
            owners[old_who] -= 1
            if owners[old_who] <= 0:
                del owners[old_who]
                changed.append(mid)
            if not owners:
                del self._owners[mid]
        for mid in ids:
            owners = self._owners.setdefault(mid, Counter())
            if owners[who] == 0:
                changed.append(mid)
            owners[who] += 1
        if ids:
            self._owns[sid] = (who, ids)
        else:
            self._owns.pop(sid, None)
        return changed

    def _conflicted(self, name: str, cand: Candidate, who: str) -> bool:
        if name == cand.model.id:
            return False
        owners = self._owners.get(name)
        return owners is not None and any(p != who for p in owners)

    def _contributions(self, record: NodeRecord, suspected: bool, who: str
                       ) -> dict[str, Candidate]:
        """name -> candidate of one session; the first served model claiming a name wins."""
        out: dict[str, Candidate] = {}
        if not listed(record):
            return out
        for served in record.meta.models:
            cand: Candidate | None = None
            for name in served.names():
                if name not in out:
                    cand = cand or Candidate.from_record(record, served, suspected, who)
                    flagged = self._conflicted(name, cand, who)
                    out[name] = dataclasses.replace(cand, alias_conflict=True) if flagged else cand
        return out

    def _reflag(self, name: str) -> None:
        """The providers of model id `name` changed: re-flag its bucket's alias candidates."""
        for sid, cand in list(zip(self._keys.get(name, ()), self._buckets.get(name, ()),
                                  strict=True)):
            if cand.model.id == name:
                continue
            flagged = self._conflicted(name, cand, cand.provider_id)
            if flagged != cand.alias_conflict:
                cand = dataclasses.replace(cand, alias_conflict=flagged)
                self._replace(name, sid, cand)
                self._of_session[sid][name] = cand

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
