"""Dead-peer detection for TCP connections we dial or accept: kernel keepalive plus
TCP_USER_TIMEOUT.

A connection whose peer vanished without FIN or RST (its host died, a partition) looks idle,
not closed: a stream waiting for the next token would wait out its idle timeout, which must
stay long because engines may pause between tokens. The kernel's keepalive probes tell the
two apart without the application: the peer's kernel ACKs a probe however long its engine
pauses, a dead peer does not, and after `count` unanswered probes the socket fails with
ETIMEDOUT (asyncio's `connection_lost`). TCP_USER_TIMEOUT (Linux) gives written but
unacknowledged data the same bound, and with keepalive on it decides when the keepalive
failure closes the connection, so both are set to the same `dead_after_s`.

Kernel units are whole seconds (keepalive) and milliseconds (user timeout); values are
rounded up, at least 1 s. Platforms without an option skip it (macOS has no
TCP_USER_TIMEOUT; its TCP_KEEPALIVE is the idle time).

Both ends watch: the dialer sets the options on its socket (`set_keepalive`), a server on its
listening sockets before it accepts anything (`start_watched_server`), and each accepted
connection inherits them from the listener (Linux copies the socket's options at accept), so
a server is not left holding half-open connections, and their work, for a vanished client.
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llmfabric.net.source_slots import SourceSlots
from llmfabric.net.tlsstream import SlotKeeper, slotted_tls_factory

# Linux's limits (MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT): a larger value fails
# every connect with EINVAL, so it is refused when the settings are made.
MAX_KEEPALIVE_S = 32767
MAX_KEEPALIVE_COUNT = 127
_INT_MAX = 2**31 - 1  # TCP_USER_TIMEOUT is a C int of milliseconds


@dataclass(frozen=True, slots=True)
class KeepAlive:
    idle_s: float = 5.0  # no traffic for this long -> first probe
    interval_s: float = 2.0  # between unanswered probes
    count: int = 3  # unanswered probes -> the connection is dead

    def __post_init__(self) -> None:
        if not (
            0 < self.idle_s <= MAX_KEEPALIVE_S
            and 0 < self.interval_s <= MAX_KEEPALIVE_S
            and 1 <= self.count <= MAX_KEEPALIVE_COUNT
        ):
            raise ValueError(
                f"keepalive needs 0 < idle_s, interval_s <= {MAX_KEEPALIVE_S} and "
                f"1 <= count <= {MAX_KEEPALIVE_COUNT}: {self}"
            )

    @property
    def dead_after_s(self) -> int:
        """Seconds of silence after which a dead peer's connection fails (kernel units)."""
        return _secs(self.idle_s) + _secs(self.interval_s) * self.count


def _secs(value: float) -> int:
    return max(1, math.ceil(value))


class _Settable(Protocol):  # a socket, or asyncio's wrapper of a server's listening socket
    def setsockopt(self, level: int, optname: int, value: int, /) -> None: ...


def keepalive_options(ka: KeepAlive) -> list[tuple[int, int, int]]:
    """(level, option, value) triples this platform supports, in the order to set them."""
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    if idle is not None:
        opts.append((socket.IPPROTO_TCP, idle, _secs(ka.idle_s)))
    if hasattr(socket, "TCP_KEEPINTVL"):
        opts.append((socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _secs(ka.interval_s)))
    if hasattr(socket, "TCP_KEEPCNT"):
        opts.append((socket.IPPROTO_TCP, socket.TCP_KEEPCNT, ka.count))
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        opts.append((socket.IPPROTO_TCP, user_timeout, min(_INT_MAX, ka.dead_after_s * 1000)))
    return opts


def set_keepalive(sock: _Settable, ka: KeepAlive) -> None:
    """Turn on dead-peer detection on a connected TCP socket (OSError if the kernel refuses:
    a connection we cannot watch should not be used silently)."""
    for level, option, value in keepalive_options(ka):
        sock.setsockopt(level, option, value)


async def start_watched_server(
    factory: Callable[[], asyncio.BaseProtocol],
    host: str | None,
    port: int,
    ka: KeepAlive,
    *,
    ssl_context: ssl.SSLContext | None = None,
    ssl_handshake_timeout: float | None = None,
    handshake_slots: SourceSlots | None = None,
    slot_keeper: SlotKeeper | None = None,
) -> asyncio.Server:
    """Like `loop.create_server(factory, host, port, ssl=..., reuse_address=True,
    ssl_handshake_timeout=...)`, with dead-peer detection on every connection it accepts: the
    options are set on the listening sockets before the first accept (inherited by each
    accepted socket). Keepalive cannot catch a peer that is alive but silent during the TLS
    handshake; `ssl_handshake_timeout` does (asyncio's default: 60 s). With
    `handshake_slots` (and TLS) each connection also holds a slot from TCP accept until its
    handshake is done (or `slot_keeper` releases it), and is aborted at accept over a cap
    (`tlsstream.slotted_tls_factory`)."""
    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {}
    if ssl_context is not None and handshake_slots is not None:
        factory = slotted_tls_factory(factory, ssl_context, ssl_handshake_timeout or 60.0,
                                      handshake_slots, slot_keeper)
    elif ssl_context is not None:
        tls = {"ssl": ssl_context, "ssl_handshake_timeout": ssl_handshake_timeout}
    server = await loop.create_server(
        factory, host, port, reuse_address=True, start_serving=False, **tls
    )
    try:
        for sock in server.sockets:
            set_keepalive(sock, ka)
    except BaseException:
        server.close()
        raise
    await server.start_serving()
    return server
