"""TLS streams with a small receive buffer: `open_tls`, `start_tls_server` and
`slotted_tls_factory` (servers that count connections mid-handshake against caps).

asyncio's TLS layer (`asyncio.sslproto.SSLProtocol`) gives every connection a 256 KiB receive
buffer, zero-filled (so resident) at creation. A node keeps one connection per peer, and
gossip/SWIM eventually connect every node to every other, so with 127 peers that buffer alone
was ~32 MiB per node (measured 327 KiB RSS per connection end in total; see
docs/network.md#memory-per-connection). A TLS record carries at most 16 KiB of plaintext, so a
buffer of four records loses nothing on our small frames and little on bulk streams.

These helpers build the same StreamReader/StreamWriter pair as `asyncio.open_connection` /
`asyncio.start_server(ssl=...)`, with `SSLProtocol.max_size` (the documented-by-source class
attribute that sizes that buffer and each plaintext read) lowered in a subclass. Only the
public constructor arguments of SSLProtocol (stable since Python 3.11) are used.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ssl
import typing
from collections.abc import Awaitable, Callable
from typing import Any, cast

from llmfabric.clock import Clock, with_timeout
from llmfabric.net.source_slots import HeldSlot, SourceSlots, peer_ip

# Bytes read from the socket per loop iteration and connection. 32 KiB saved another 32 KiB
# per connection but could not keep up with a datagram burst (200 per iteration: 13%
# dropped at the 1 MiB write limit); 64 KiB keeps up (0 dropped, see docs/network.md).
TLS_READ_BUFFER = 64 * 1024
STREAM_LIMIT = 64 * 1024  # StreamReader buffer limit (asyncio's default)

# on_connect of `start_tls_server`: the streams and the connection's handshake slot.
SlottedConnected = Callable[
    [asyncio.StreamReader, asyncio.StreamWriter, HeldSlot], Awaitable[None]
]


class _CompactSSLProtocol(asyncio.sslproto.SSLProtocol):
    max_size = TLS_READ_BUFFER


async def open_tls(
    host: str,
    port: int,
    ctx: ssl.SSLContext,
    clock: Clock,
    connect_timeout: float,
    tls_timeout: float,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Like `asyncio.open_connection(host, port, ssl=ctx, server_hostname="")` (no SNI), with
    separate limits for the TCP connect and the TLS handshake: an unreachable address fails
    fast, while a busy (CPU-starved) peer gets the longer handshake time to answer.
    Raises OSError, ssl.SSLError or TimeoutError."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    opened: asyncio.Future[asyncio.StreamWriter] = loop.create_future()

    def connected(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        opened.set_result(w)

    handshake: asyncio.Future[None] = loop.create_future()
    # Whatever happens to the awaiting task, the handshake outcome is retrieved.
    handshake.add_done_callback(lambda f: f.cancelled() or f.exception())

    def factory() -> asyncio.BaseProtocol:
        # Made only once TCP is connected: the TLS protocol owns a transport object that
        # must see connection_lost (else it warns "unclosed transport" when collected).
        app = asyncio.StreamReaderProtocol(reader, connected, loop=loop)
        return _CompactSSLProtocol(loop, app, ctx, handshake, server_side=False)

    raw, _ = await with_timeout(clock, loop.create_connection(factory, host, port), connect_timeout)
    try:
        await with_timeout(clock, handshake, tls_timeout)
    except BaseException:
        raw.abort()
        raise
    return reader, opened.result()


class ServerTlsLayer(_CompactSSLProtocol):
    """The server side of one accepted TLS connection, carrying `app` (an asyncio.Protocol),
    aborted if its handshake is not done `handshake_timeout` seconds after the TCP accept."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: asyncio.BaseProtocol,
                 ctx: ssl.SSLContext, handshake_timeout: float) -> None:
        # (typeshed wants a future for the waiter and an int timeout; None and float work)
        no_waiter: Any = None
        limit: Any = handshake_timeout
        protocol: Any = app
        super().__init__(loop, protocol, ctx, no_waiter, server_side=True,
                         ssl_handshake_timeout=limit)


class _SlottedServerSSL(ServerTlsLayer):
    """The TLS layer of one accepted connection that takes a slot at TCP accept (aborting at
    once over a cap) and gives it back if the connection ends, whatever its stage."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: asyncio.BaseProtocol,
                 ctx: ssl.SSLContext, handshake_timeout: float, slot: HeldSlot) -> None:
        super().__init__(loop, app, ctx, handshake_timeout)
        self._slot = slot

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._slot.take(peer_ip(transport)):
            cast(asyncio.Transport, transport).abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._slot.release()  # no-op when refused at accept or released by on_connect
        super().connection_lost(exc)


class SlotKeeper(typing.Protocol):
    """Takes over the slot of a connection whose TLS handshake is done, for an application
    handshake of its own (the data plane: the first authorized request)."""

    def keep(self, transport: asyncio.BaseTransport, slot: HeldSlot) -> None:
        """`transport`'s TLS is done: release `slot` when its application handshake is."""

    def forget(self, transport: asyncio.BaseTransport) -> None:
        """`transport` closed (its slot is given back by the TLS layer)."""


class _ReleaseAtHandshake(asyncio.Protocol):
    """`app` behind a slotted TLS layer: when the layer hands it the connection (the TLS
    handshake is done) the slot is given back, or passed to `keeper`; every callback goes on
    to `app` unchanged."""

    def __init__(self, app: asyncio.Protocol, slot: HeldSlot, keeper: SlotKeeper | None) -> None:
        self._app = app
        self._slot = slot
        self._keeper = keeper
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._keeper is None:
            self._slot.release()
        else:
            self._transport = transport
            self._keeper.keep(transport, self._slot)
        self._app.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._keeper is not None and self._transport is not None:
            self._keeper.forget(self._transport)
        self._app.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._app.data_received(data)

    def eof_received(self) -> bool | None:
        return self._app.eof_received()

    def pause_writing(self) -> None:
        self._app.pause_writing()

    def resume_writing(self) -> None:
        self._app.resume_writing()


def slotted_tls_factory(
    app_factory: Callable[[], asyncio.BaseProtocol],
    ctx: ssl.SSLContext,
    handshake_timeout: float,
    slots: SourceSlots,
    keeper: SlotKeeper | None = None,
) -> Callable[[], asyncio.BaseProtocol]:
    """A `create_server` protocol factory (no `ssl=` there) serving `app_factory`'s protocols
    over TLS, each connection holding a slot of `slots` from TCP accept until its TLS
    handshake is done (aborted at accept over a cap; `handshake_timeout` as in
    `start_tls_server`), or, with a `keeper`, until the keeper releases it (an application
    handshake after TLS). The TLS layer gives it back when the connection ends first."""
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.BaseProtocol:
        slot = HeldSlot(slots)
        app = _ReleaseAtHandshake(cast(asyncio.Protocol, app_factory()), slot, keeper)
        return _SlottedServerSSL(loop, app, ctx, handshake_timeout, slot)

    return factory


async def start_tls_server(
    on_connect: SlottedConnected,
    host: str,
    port: int,
    ctx: ssl.SSLContext,
    *,
    handshake_timeout: float,
    slots: SourceSlots,
) -> asyncio.Server:
    """Like `asyncio.start_server(on_connect, host, port, ssl=ctx)`, with two bounds on
    connections that have not finished their handshakes:
    - one that has not finished its TLS handshake `handshake_timeout` seconds after it was
      accepted is aborted (asyncio's default is 60 s: a peer could hold sockets and TLS
      buffers that long for the price of a TCP connect);
    - each takes a slot of `slots` at TCP accept, or is aborted there over a cap. The slot
      is `on_connect`'s third argument: it is given back when the connection ends or when
      `on_connect` releases it (its own handshake done), whichever comes first."""
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.BaseProtocol:
        reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
        slot = HeldSlot(slots)

        def connected(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> Awaitable[None]:
            return on_connect(r, w, slot)

        app = asyncio.StreamReaderProtocol(reader, connected, loop=loop)
        return _SlottedServerSSL(loop, app, ctx, handshake_timeout, slot)

    return await loop.create_server(factory, host, port)
