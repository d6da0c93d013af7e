"""Keep a node that cannot be dialled registered with enough relays, for as long as it runs.

A NATed node is reachable only through the relays it registered with. Choosing them once at
start-up is not enough: the registry may not list any relay yet (so the bootstrap peers are
tried, and they may not relay), a relay may leave for good, or never answer. `RelayKeeper`
re-selects continuously:

- relays that left the fabric (`gone`) are dropped at once;
- while fewer than `want` relays accept our registration, it adds candidates (relay-role
  peers the registry lists as neither LEFT nor suspected, given by `candidates()`); a
  candidate that has not registered within `patience_s` is replaced by another one when
  there is another one; with no candidate known, the `fallback()` peers (the bootstrap
  peers) are tried;
- it re-checks after exponential backoff with full jitter while unsatisfied, every
  `interval_s` once satisfied, and at once when `poke()`d (a relay registration was lost).

The registry is not imported here: the node passes `candidates`, `gone` and `fallback`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

from llmfabric.clock import Clock, with_timeout
from llmfabric.net.backoff import Backoff
from llmfabric.net.transport import PeerId
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class RelayClient(Protocol):
    """What the keeper drives (TlsTransport implements it)."""

    @property
    def local_id(self) -> PeerId: ...

    @property
    def relays(self) -> tuple[PeerId, ...]: ...

    @property
    def relays_in_use(self) -> tuple[PeerId, ...]: ...

    def use_relays(self, relay_ids: Sequence[PeerId]) -> None: ...

    def drop_relays(self, relay_ids: Sequence[PeerId]) -> None: ...


class RelayKeeper:
    def __init__(
        self,
        client: RelayClient,
        clock: Clock,
        backoff: Backoff,
        *,
        candidates: Callable[[], Sequence[PeerId]],
        gone: Callable[[PeerId], bool],
        fallback: Callable[[], Sequence[PeerId]] = tuple,
        want: int = 1,
        interval_s: float = 10.0,
        patience_s: float = 30.0,
    ) -> None:
        if want < 1:
            raise ValueError("want must be >= 1 relay")
        self._client = client
        self._clock = clock
        self._backoff = backoff
        self._candidates = candidates
        self._gone = gone
        self._fallback = fallback
        self.want = want
        self._interval = interval_s
        self._patience = patience_s
        self._added: dict[PeerId, float] = {}  # relay -> when we started using it
        self._wake = asyncio.Event()
        self.steps = 0
        self.dropped: list[PeerId] = []  # for logs and tests

    def poke(self) -> None:
        """Re-check now (e.g. a relay registration was lost)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            satisfied = self.step()
            if satisfied:
                self._backoff.reset()
                delay = self._interval
            else:
                delay = self._backoff.next_delay()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await with_timeout(self._clock, self._wake.wait(), delay)

    def step(self) -> bool:
        """One re-selection; True when at least `want` live relays have us registered."""
        self.steps += 1
        c = self._client
        now = self._clock.now()
        me = c.local_id
        registered = set(c.relays)
        in_use = set(c.relays_in_use)
        for r in list(self._added):
            if r not in in_use:
                del self._added[r]
        gone = [r for r in sorted(in_use) if self._gone(r)]
        if gone:
            self._drop(gone, "left the fabric")
            in_use -= set(gone)
            registered -= set(gone)
        usable = registered & in_use
        if len(usable) >= self.want:
            return True
        good = list(dict.fromkeys(p for p in self._candidates() if p != me))
        pending = in_use - registered
        stale = {r for r in pending if now - self._added.setdefault(r, now) >= self._patience}
        fresh = [p for p in good if p not in in_use]
        if not good and not in_use:
            fresh = [p for p in dict.fromkeys(self._fallback()) if p != me and p not in in_use]
        need = self.want - len(usable) - len(pending - stale)
        add = fresh[:max(0, need)]
        if add:
            for r in add:
                self._added[r] = now
            log.info("using relay(s) %s (%d of %d registered)", ", ".join(add),
                     len(usable), self.want)
            c.use_relays(add)
            # A candidate that never registered makes way for the new ones.
            replaced = sorted(stale)[:len(add)]
            if replaced:
                self._drop(replaced, f"did not accept our registration within "
                                     f"{self._patience:.0f}s")
        return False

    def _drop(self, relays: list[PeerId], why: str) -> None:
        log.info("dropping relay(s) %s: %s", ", ".join(relays), why)
        self.dropped.extend(relays)
        for r in relays:
            self._added.pop(r, None)
        self._client.drop_relays(relays)
