"""Per-session watches of a node going down, for the ingress to drop a waiting attempt.

A watch is registered for one session with the level of doubt the caller already accepted
(the session's level when the watch starts: `LIVE`, or `SUSPECTED` when the router picked a
suspected candidate as its fallback) and is fired once, when a change of that session reaches
a worse level (`SUSPECTED`, then `GONE`: evicted, LEFT or dropped). Registering, firing and
removing cost O(watches of that session): nothing is done per fleet member, and a change of
an unwatched session costs one dict lookup.
Pure core: plain callbacks, no event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from llmfabric.registry.entry import Entry
from llmfabric.registry.records import Lifecycle

LIVE, SUSPECTED, GONE = 0, 1, 2

OnDown = Callable[[int], None]  # called once with the level reached
Unwatch = Callable[[], None]


def level_of(entry: Entry | None) -> int:
    """How down a session is by its replica entry (None: no longer held)."""
    if entry is None or entry.record is None or entry.state is Lifecycle.LEFT:
        return GONE
    return SUSPECTED if entry.suspected else LIVE


class DownWatches:
    def __init__(self) -> None:
        self._by_session: dict[str, dict[int, tuple[int, OnDown]]] = {}
        self._next = 0

    def watch(self, session_id: str, accepted: int, on_down: OnDown) -> Unwatch:
        """Call `on_down(level)` once when the session's level rises above `accepted`;
        the returned callable removes the watch (idempotent; call it when the wait ends)."""
        key = self._next
        self._next += 1
        self._by_session.setdefault(session_id, {})[key] = (accepted, on_down)

        def unwatch() -> None:
            mine = self._by_session.get(session_id)
            if mine is not None and mine.pop(key, None) is not None and not mine:
                del self._by_session[session_id]

        return unwatch

    def changed(self, session_id: str, level: int) -> None:
        """A change of the session reached `level`: fire (and drop) the watches it passes."""
        mine = self._by_session.get(session_id)
        if mine is None or level == LIVE:
            return
        fired = [(k, fn) for k, (accepted, fn) in mine.items() if level > accepted]
        for k, _ in fired:
            del mine[k]
        if not mine:
            del self._by_session[session_id]
        for _, fn in fired:
            fn(level)

    def sessions(self) -> list[str]:
        return list(self._by_session)

    def watching(self, session_id: str) -> bool:
        return session_id in self._by_session

    def __len__(self) -> int:
        """Live watches over all sessions (a leak shows here)."""
        return sum(len(m) for m in self._by_session.values())
