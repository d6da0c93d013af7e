"""Idle-connection closing and the open-connection cap (`TransportConfig.idle_close_s`,
`max_connections`, `evict_min_idle_s`).

Neither closes a connection with requests in flight or a relay registration connection. A
close is `PeerConnection.close_if_idle()`: checked and done in one step, announced to the
peer as an idle close so its unanswered requests are resent (see docs/network.md).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from llmfabric.net.connection import PeerConnection

if TYPE_CHECKING:
    from llmfabric.net.tls_transport import TlsTransport


class ConnectionLimits:
    def __init__(self, transport: TlsTransport) -> None:
        self.t = transport
        self._reaper: asyncio.Task[None] | None = None

    def evictable(self, conn: PeerConnection) -> bool:
        return conn.is_open and not conn.busy and not self.t.relay.is_protected(conn.peer_id)

    def enforce_cap(self, keep: PeerConnection) -> None:
        """Over `max_connections`: close the least recently used connections idle for at
        least `evict_min_idle_s` (never `keep`, the one just opened)."""
        cfg = self.t.config
        if cfg.max_connections is None:
            return
        open_conns = [c for c in self.t._conns.values() if c.is_open]
        excess = len(open_conns) - cfg.max_connections
        if excess <= 0:
            return
        cutoff = self.t.clock.now() - cfg.evict_min_idle_s
        victims = sorted(
            (
                c
                for c in open_conns
                if c is not keep and c.last_used <= cutoff and self.evictable(c)
            ),
            key=lambda c: c.last_used,
        )
        for conn in victims[:excess]:
            if conn.close_if_idle():
                self.t.stats.connections_evicted += 1

    def start(self) -> None:
        """Start the idle reaper (once; on the transport's first connection)."""
        idle_s = self.t.config.idle_close_s
        if self._reaper is None and idle_s is not None and not self.t._closing:
            self._reaper = self.t.spawn(self._reap_idle(idle_s))

    async def _reap_idle(self, idle_s: float) -> None:
        """Close connections idle for `idle_s` (checked every idle_s / 4)."""
        while True:
            await self.t.clock.sleep(idle_s / 4)
            cutoff = self.t.clock.now() - idle_s
            for conn in list(self.t._conns.values()):
                if conn.last_used <= cutoff and self.evictable(conn) and conn.close_if_idle():
                    self.t.stats.connections_idle_closed += 1
