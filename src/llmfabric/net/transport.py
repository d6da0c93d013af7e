"""The Transport interface that gossip and membership talk to.

It carries small datagram-like messages between peers named by peer id. Delivery is best
effort (like UDP): `send` never blocks and never raises for an unreachable peer; the protocols
above tolerate loss, delay, duplication and reordering. Implementations: the real TLS transport
in net/ and the in-memory fake network in llmfabric.testing.memnet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

PeerId = str
MessageHandler = Callable[[PeerId, bytes], None]


class Transport(Protocol):
    @property
    def local_id(self) -> PeerId: ...

    def send(self, peer: PeerId, payload: bytes) -> None:
        """Queue `payload` for `peer`; drop it (and count the drop) if it cannot be delivered."""
        ...

    def set_handler(self, handler: MessageHandler) -> None:
        """Install the callback for every message received; it runs on the event loop."""
        ...
