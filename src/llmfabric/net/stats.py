"""Transport counters: a plain object the node exports (e.g. to Prometheus).

Totals only grow; `rates(prev, cur)` turns two snapshots into per-second rates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Drop / refusal reasons (label values). Append-only.
DROP_REASONS = (
    "unreachable",  # no connection could be made to the peer
    "queue_full",  # the connection's write buffer is over its limit
    "garbled",  # undecodable frame or payload
    "oversized",  # frame longer than the limit
    "wrong_version",  # frame version this node does not speak
    "bad_signature",  # peer presented an invalid signature
    "unknown_type",  # frame type from a newer peer, skipped
    "no_handler",  # no message handler installed
    "closed",  # transport closing
    "untrusted_relay",  # relayed datagram from a node that is not one of our relays
)


@dataclass(slots=True)
class NetStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    requests_sent: int = 0
    requests_served: int = 0
    requests_relayed: int = 0
    connections_opened: int = 0
    connections_idle_closed: int = 0  # closed after TransportConfig.idle_close_s of silence
    connections_evicted: int = 0  # closed to stay under TransportConfig.max_connections
    peers_lost: int = 0  # connections in use that ended without a CLOSE (on_peer_lost)
    handshakes_ok: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    handshakes_refused: Counter[str] = field(default_factory=Counter)
    # failures caught (and logged) so the transport keeps running, by where: request_handler,
    # respond, message_handler, peer_lost_callback, relay_listener, connection_task, task
    errors: Counter[str] = field(default_factory=Counter)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n

    def error(self, where: str) -> None:
        self.errors[where] += 1

    def snapshot(self, at: float) -> StatsSnapshot:
        return StatsSnapshot(
            at=at,
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            datagrams_sent=self.datagrams_sent,
            datagrams_received=self.datagrams_received,
            dropped=tuple(sorted(self.dropped.items())),
            handshakes_refused=tuple(sorted(self.handshakes_refused.items())),
        )


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    at: float  # clock.now() when taken
    bytes_sent: int
    bytes_received: int
    datagrams_sent: int
    datagrams_received: int
    dropped: tuple[tuple[str, int], ...]
    handshakes_refused: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Rates:
    bytes_sent_per_s: float
    bytes_received_per_s: float
    datagrams_sent_per_s: float
    datagrams_received_per_s: float


def rates(prev: StatsSnapshot, cur: StatsSnapshot) -> Rates:
    dt = cur.at - prev.at
    if dt <= 0:
        return Rates(0.0, 0.0, 0.0, 0.0)
    return Rates(
        (cur.bytes_sent - prev.bytes_sent) / dt,
        (cur.bytes_received - prev.bytes_received) / dt,
        (cur.datagrams_sent - prev.datagrams_sent) / dt,
        (cur.datagrams_received - prev.datagrams_received) / dt,
    )
