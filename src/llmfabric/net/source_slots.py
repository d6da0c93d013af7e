"""`SourceSlots`: a count of things held per process and per source address under two caps,
`HeldSlot`, one slot that is given back exactly once whichever path ends it, and `peer_ip`,
the source a connection counts against.

The lean front counts open client connections in it (front/front_limits.py); the
peer transport counts connections that have not finished their handshakes (TLS, then the
peer handshake), and the provider's data-plane listener those before their first
authorized request, so a flood of silent connections is refused at TCP accept instead of
holding sockets and TLS buffers until a time limit cuts each one.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable


def peer_ip(transport: asyncio.BaseTransport) -> str:
    """The source a connection's slots count against ("" when the transport does not say):
    its IPv4 address, or its IPv6 address's /64 (one host or site is routinely given a
    whole /64, so counting single IPv6 addresses would let one host fill every slot)."""
    peer = transport.get_extra_info("peername")
    if not (isinstance(peer, tuple) and peer):
        return ""
    return source_of(str(peer[0]))


def source_of(ip: str) -> str:
    """`ip` as a counting source: IPv4 as is (also when IPv4-mapped), IPv6 as its /64."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])  # (a zone index: fe80::1%eth0)
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


class SourceSlots:
    """Slots per process (`max_total`) and per source address (`max_per_source`); None: no
    cap."""

    def __init__(
        self,
        max_total: int | None,
        max_per_source: int | None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.max_total = max_total
        self.max_per_source = max_per_source
        self.total = 0
        self.per_source: dict[str, int] = {}
        self.refused = 0  # slots refused at a cap
        self._on_refused = on_refused  # told of each refusal (an owner's own counters)

    def take(self, source: str) -> bool:
        """A slot for `source`; False (and counted) over a cap."""
        held = self.per_source.get(source, 0)
        if (self.max_total is not None and self.total >= self.max_total) or (
            self.max_per_source is not None and held >= self.max_per_source
        ):
            self.refused += 1
            if self._on_refused is not None:
                self._on_refused()
            return False
        self.per_source[source] = held + 1
        self.total += 1
        return True

    def give_back(self, source: str) -> None:
        """Release a slot `take(source)` gave (exactly once per slot)."""
        assert self.total > 0, "a slot given back twice"
        self.total -= 1
        left = self.per_source.get(source, 1) - 1
        if left > 0:
            self.per_source[source] = left
        else:
            self.per_source.pop(source, None)


class HeldSlot:
    """At most one slot of `slots` for one connection: `take` it when the connection is
    accepted, `release` it from every path that can end its claim (done, refused, lost);
    only the first release gives it back."""

    __slots__ = ("_slots", "held", "source")

    def __init__(self, slots: SourceSlots) -> None:
        self._slots = slots
        self.source = ""
        self.held = False

    def take(self, source: str) -> bool:
        self.source = source
        self.held = self._slots.take(source)
        return self.held

    def release(self) -> None:
        if self.held:
            self.held = False
            self._slots.give_back(self.source)
