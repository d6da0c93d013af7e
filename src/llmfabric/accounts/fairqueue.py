"""Fair queueing of requests across owners when an ingress is saturated (virtual token
counters, after Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024).

At most `capacity` requests are in flight. Past that, requests wait in one FIFO per owner,
and a freed slot goes to the waiting owner whose counter (tokens admitted so far) is lowest.
An owner that starts waiting has its counter lifted to the lowest counter among owners
already served or waiting, so idle time earns no credit to flood with later. A flooding
owner thus gets its share, never everyone's: another owner's request waits for at most about
one slot turnover per owner ahead of it.

A request that cannot be queued (its owner already has `max_waiting_per_owner` waiting) or
waits longer than `max_wait_s` is refused with the wait it would have had
(`QueueRefused.retry_after_s`), estimated from the measured mean slot hold time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueRefused:
    owner: str
    waiting: int  # this owner's requests waiting when refused
    retry_after_s: float
    reason: str  # "queue_full" or "queue_timeout"


@dataclass(slots=True)
class _Waiter:
    owner: str
    cost: int
    future: asyncio.Future[None]


class FairQueue:
    def __init__(self, capacity: int, *, max_waiting_per_owner: int = 256,
                 max_wait_s: float = 30.0, now: Callable[[], float]) -> None:
        if capacity < 1:
            raise ValueError("fair queue capacity must be >= 1")
        self.capacity = capacity
        self.max_waiting_per_owner = max_waiting_per_owner
        self.max_wait_s = max_wait_s
        self.now = now
        self.inflight = 0
        self.counters: dict[str, float] = {}  # owner -> virtual tokens admitted
        self._waiting: dict[str, deque[_Waiter]] = {}
        self.mean_hold_s = 1.0  # EWMA of how long a request holds its slot
        self.admitted_total = 0
        self.refused_total = 0

    def waiting(self, owner: str | None = None) -> int:
        if owner is not None:
            q = self._waiting.get(owner)
            return len(q) if q else 0
        return sum(len(q) for q in self._waiting.values())

    def expected_wait_s(self, owner: str) -> float:
        """About how long a new request of `owner` would wait: the slots that must turn
        over before its turn (its own queue, and one per other waiting owner per round)."""
        mine = self.waiting(owner) + 1
        others = sum(min(len(q), mine) for o, q in self._waiting.items() if o != owner)
        return (mine + others) * self.mean_hold_s / self.capacity

    def _lift(self, owner: str) -> None:
        """VTC's rule: an owner that starts waiting is lifted to the lowest counter of the
        owners already waiting (no credit for idle time)."""
        floor = min((self.counters.get(o, 0.0) for o, q in self._waiting.items()
                     if q and o != owner), default=None)
        if floor is not None and self.counters.get(owner, 0.0) < floor:
            self.counters[owner] = floor

    async def acquire(self, owner: str, cost: int) -> float | QueueRefused:
        """Wait for a slot; returns the start time (for `release`) or a refusal."""
        if self.inflight < self.capacity and not self.waiting():
            return self._admit(owner, cost)
        q = self._waiting.get(owner)
        if q is not None and len(q) >= self.max_waiting_per_owner:
            self.refused_total += 1
            return QueueRefused(owner, len(q), self.expected_wait_s(owner), "queue_full")
        self._lift(owner)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        w = _Waiter(owner, cost, fut)
        self._waiting.setdefault(owner, deque()).append(w)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.max_wait_s)
        except TimeoutError:
            if fut.done():  # granted just as the timer fired: keep the slot
                return self.now()
            self._drop(w)
            self.refused_total += 1
            return QueueRefused(owner, self.waiting(owner), self.expected_wait_s(owner),
                                "queue_timeout")
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(self.now())  # granted, but the caller is gone: pass it on
            else:
                self._drop(w)
            raise
        return self.now()

    def _admit(self, owner: str, cost: int) -> float:
        self.inflight += 1
        self.admitted_total += 1
        self.counters[owner] = self.counters.get(owner, 0.0) + max(1, cost)
        return self.now()

    def _drop(self, w: _Waiter) -> None:
        q = self._waiting.get(w.owner)
        if q is not None:
            with contextlib.suppress(ValueError):
                q.remove(w)
            if not q:
                del self._waiting[w.owner]
        if not w.future.done():
            w.future.cancel()

    def release(self, started: float) -> None:
        """A request that held a slot since `started` ended: hand the slot on."""
        held = max(0.0, self.now() - started)
        self.mean_hold_s += 0.1 * (held - self.mean_hold_s)
        self.inflight -= 1
        while self.inflight < self.capacity and self._waiting:
            # lowest counter first; on a tie, the owner with fewer requests waiting
            owner = min(self._waiting,
                        key=lambda o: (self.counters.get(o, 0.0), len(self._waiting[o])))
            q = self._waiting[owner]
            w = q.popleft()
            if not q:
                del self._waiting[owner]
            if w.future.done():
                continue
            self._admit(w.owner, w.cost)
            w.future.set_result(None)
