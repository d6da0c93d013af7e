"""Lifeguard suspicion timers: when does an unrefuted suspicion become an eviction?

Every replica starts a local timer when it first sees a session suspected (an unrefuted
SUSPECT fact in its replica). The timeout starts at the Lifeguard maximum and shrinks toward
the minimum as independent confirmations (distinct suspecting members) arrive:
``max(min, max - (max - min) * log(C + 1) / log(K + 1))`` with
``min = suspicion_mult * max(1, log10(n)) * probe_interval`` and
``max = suspicion_max_mult * min`` (see GossipConfig). When the timer expires while the
suspicion still stands, the replica's agent issues a signed EVICT fact, which is irreversible.
A refutation (higher incarnation) or a LEFT state clears the timer.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmfabric.clock import Clock
from llmfabric.membership.params import SuspicionParams
from llmfabric.registry.entry import Entry
from llmfabric.registry.records import Lifecycle


class SuspicionTracker:
    def __init__(self, clock: Clock, config: SuspicionParams) -> None:
        self._clock = clock
        self._cfg = config
        self.since: dict[str, float] = {}

    def observe(self, entry: Entry) -> None:
        """Call on every replica change: start or clear the session's timer."""
        if entry.suspected and entry.state is not Lifecycle.LEFT:
            self.since.setdefault(entry.session_id, self._clock.now())
        else:
            self.since.pop(entry.session_id, None)

    def timeout(self, entry: Entry, n: int) -> float:
        return self._cfg.suspicion_timeout(n, len(entry.suspects))

    def due(self, entries: Mapping[str, Entry], n: int) -> list[Entry]:
        """Suspected entries whose timeout has expired (their timers are cleared)."""
        now = self._clock.now()
        out = []
        for sid, t0 in list(self.since.items()):
            e = entries.get(sid)
            if e is None or not e.suspected or e.state is Lifecycle.LEFT:
                del self.since[sid]
            elif now - t0 >= self.timeout(e, n):
                del self.since[sid]
                out.append(e)
        return out
