"""A candidate source over a live registry replica, kept current by its change listener.

`ReplicaCandidateSource(current_replica)` follows whatever replica `current_replica()` returns
(a node gets a new replica when it rejoins after an eviction): on the first lookup after a
switch it builds its `CandidateIndex` from that replica's entries once and subscribes to its
changes; from then on every change (a join, a load hint, a suspicion, a LEFT) updates only
the sessions it touches. Lookups never read the replica (`watch_down` reads one entry).

It also keeps the ingress's `DownWatches` (liveness.py): the same change listener fires the
watches of a session that became suspected or gone, so an attempt waiting on that node can
move on at once (ingress/attempt.py `AbandonIfDown`).

Known limit, as with the version-counted rebuild it replaces: an entry the replica drops
without a change event (a LEFT record that arrives already past retention) stays in the index
until its session changes again or the replica is switched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmfabric.registry.entry import Entry
from llmfabric.registry.replica import Change, Replica
from llmfabric.registry.views import view_of
from llmfabric.routing.candidates import Candidate, Identify, claimed_provider
from llmfabric.routing.index import CandidateIndex
from llmfabric.routing.liveness import GONE, LIVE, SUSPECTED, DownWatches, OnDown, Unwatch, level_of


class ReplicaCandidateSource:
    def __init__(self, current_replica: Callable[[], Replica],
                 identify: Identify = claimed_provider) -> None:
        """`identify(record)` names the verified provider (registry.provider; the node passes
        the same one as for RecordsCandidateSource)."""
        self._current = current_replica
        self._identify = identify
        self._followed: Replica | None = None
        self.index = CandidateIndex(identify)
        self.rebuilds = 0  # full builds (one per replica followed)
        self.down = DownWatches()

    def _fresh(self) -> CandidateIndex:
        replica = self._current()
        if replica is not self._followed:
            if self._followed is not None:
                self._followed.remove_listener(self._on_change)
            self.index = CandidateIndex(self._identify)
            for entry in replica.entries.values():
                self._apply(entry)
            replica.add_listener(self._on_change)
            self._followed = replica
            self.rebuilds += 1
            for sid in self.down.sessions():  # (watched, and not held by the new replica)
                if sid not in replica.entries:
                    self.down.changed(sid, GONE)
        return self.index

    def _on_change(self, change: Change) -> None:
        self._apply(change.after)

    def _apply(self, entry: Entry) -> None:
        if self.down.watching(entry.session_id):
            self.down.changed(entry.session_id, level_of(entry))
        view = view_of(entry, 0.0)
        if view is None:
            self.index.remove(entry.session_id)
        else:
            self.index.update(entry.session_id, view.record, view.suspected)

    def close(self) -> None:
        """Stop following the replica (the index keeps its last state)."""
        if self._followed is not None:
            self._followed.remove_listener(self._on_change)
            self._followed = None

    # ---- CandidateSource (llmfabric.ingress.protocols) ----------------------------------
    def candidates(self, model: str) -> Sequence[Candidate]:
        return self._fresh().candidates(model)

    def is_known(self, model: str) -> bool:
        return self._fresh().is_known(model)

    def all_candidates(self) -> Sequence[Candidate]:
        return self._fresh().all_candidates()

    def watch_down(self, cand: Candidate, on_down: OnDown) -> Unwatch | None:
        """Call `on_down(level)` once if `cand`'s session becomes more doubtful than it is now
        (suspected, then gone); returns the unwatch. "Now" is the replica's entry, not the
        candidate's flag: a request's candidate list may be older than its retry."""
        replica = self._followed
        now = (level_of(replica.entries.get(cand.session_id)) if replica is not None
               else SUSPECTED if cand.suspected else LIVE)
        return self.down.watch(cand.session_id, now, on_down)
