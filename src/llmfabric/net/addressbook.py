"""Where peers can be reached: direct "host:port" addresses and the relays that reach them.

The node fills it from registry records (NodeMeta.peer_addrs / NodeMeta.relays); the transport
also learns addresses from bootstrap connections.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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
