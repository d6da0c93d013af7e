"""Where peers can be reached: direct "host:port" addresses and the relays that reach them.

The node fills it from registry records (NodeMeta.peer_addrs / NodeMeta.relays); the transport
also learns addresses from bootstrap connections.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from llmfabric.clock import SystemClock, with_timeout


@dataclass(frozen=True, slots=True)
class PeerAddrs:
    addrs: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()


def parse_addr(addr: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:port"); raise ValueError with the expected form."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} must look like host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class AddressBook:
    def __init__(self) -> None:
        self._peers: dict[str, PeerAddrs] = {}

    def set(self, peer_id: str, addrs: Iterable[str] = (), relays: Iterable[str] = ()) -> None:
        self._peers[peer_id] = PeerAddrs(tuple(dict.fromkeys(addrs)), tuple(dict.fromkeys(relays)))

    def learn_addr(self, peer_id: str, addr: str) -> None:
        cur = self._peers.get(peer_id, PeerAddrs())
        if addr not in cur.addrs:
            self._peers[peer_id] = PeerAddrs((*cur.addrs, addr), cur.relays)

    def remove(self, peer_id: str) -> None:
        self._peers.pop(peer_id, None)

    def get(self, peer_id: str) -> PeerAddrs:
        return self._peers.get(peer_id, PeerAddrs())

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def peers(self) -> tuple[str, ...]:
        return tuple(self._peers)


async def host_addrs(port: int) -> tuple[str, ...]:
    """Non-loopback IPv4 addresses of this host's name (for a wildcard listener); set
    TransportConfig.public_addr when they are wrong (NAT, several interfaces)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await with_timeout(
            SystemClock(),
            loop.getaddrinfo(socket.gethostname(), port, family=socket.AF_INET),
            2.0,
        )
    except (OSError, TimeoutError):
        return ()
    addrs = {str(info[4][0]) for info in infos}
    return tuple(f"{a}:{port}" for a in sorted(addrs) if not a.startswith("127."))
