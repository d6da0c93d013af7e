"""The SWIM messages (PING, ACK, PING_REQ) as the prober builds and reads them.

They live here, below gossip, because the prober sends them; gossip.wire encodes them in the
one versioned envelope together with the gossip and anti-entropy kinds (`MsgKind`).
A `WireItem` is a registry item as it travels: ``(item_kind, body, signature)``.
"""

from __future__ import annotations

from dataclasses import dataclass

WireItem = tuple[int, bytes, bytes]


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    target_session: str
    items: tuple[WireItem, ...] = ()


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int
    items: tuple[WireItem, ...] = ()


@dataclass(frozen=True, slots=True)
class PingReq:
    seq: int
    target_peer: str
    target_session: str


SwimMessage = Ping | Ack | PingReq
