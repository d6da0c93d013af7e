"""`DialGate`: at most `limit` connection attempts in flight per upstream; the next ones wait
their turn in arrival order.

A burst of requests to a node with no idle pooled connection would otherwise open one TLS
connection per request at once: hundreds of handshakes landing together on one provider
(CPU it spends before serving anything), and over the provider's cap on connections
mid-handshake per address (node/serve/dataplane_server.py), refused. Dialling `limit` at a
time costs the burst a few handshake times at most; each waiter also takes a connection that
comes back to the pool meanwhile (the caller looks again once it has its turn).
"""

from __future__ import annotations

import asyncio
from collections import deque


class DialGate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("DialGate limit must be >= 1")
        self.limit = limit
        self._busy: dict[str, int] = {}  # key -> dials in flight
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def in_flight(self, key: str) -> int:
        return self._busy.get(key, 0)

    async def acquire(self, key: str) -> None:
        """Wait for a dial slot of `key` (cancellable; a slot granted to a cancelled waiter
        passes on to the next)."""
        busy = self._busy.get(key, 0)
        if busy < self.limit:
            self._busy[key] = busy + 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release(key)  # granted just as we were cancelled: hand it on
            else:
                waiters = self._waiting.get(key)
                if waiters is not None and turn in waiters:
                    waiters.remove(turn)
                    if not waiters:
                        del self._waiting[key]
            raise

    def release(self, key: str) -> None:
        """Give back a slot `acquire(key)` granted: to the first waiter, else free it."""
        waiters = self._waiting.get(key)
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                if not waiters:
                    del self._waiting[key]
                turn.set_result(None)  # the slot passes on; the count stays
                return
        self._waiting.pop(key, None)
        left = self._busy.get(key, 0) - 1
        if left > 0:
            self._busy[key] = left
        else:
            self._busy.pop(key, None)
