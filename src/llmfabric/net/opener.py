"""`ConnectionOpener`: an authenticated `PeerConnection` from a TLS stream, both ways.

Outbound (`dial`): TCP connect and TLS (tlsstream.py), then the client side of the
application handshake, pinning the expected peer id (handshake.py). Inbound (`accept`): the
server side of the handshake on a stream the listener accepted. A refused handshake is
counted by its code (`NetStats.handshakes_refused`; a node reaching itself is code "self")
and its stream closed; the connection is not registered here: `TlsTransport` decides
which connection to a peer it keeps.
"""

from __future__ import annotations

import asyncio
import contextlib

from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.identity.admission import Admission
from llmfabric.identity.certs import make_self_signed_cert
from llmfabric.identity.keys import NodeKey
from llmfabric.net.addressbook import parse_addr
from llmfabric.net.config import TransportConfig
from llmfabric.net.connection import ConnectionOwner, PeerConnection, set_nodelay
from llmfabric.net.errors import HandshakeRefused, PeerUnreachable
from llmfabric.net.handshake import (
    FramedReader,
    HandshakeConfig,
    client_handshake,
    client_ssl_context,
    server_handshake,
    server_ssl_context,
)
from llmfabric.net.source_slots import HeldSlot
from llmfabric.net.stats import NetStats
from llmfabric.net.tlsstream import open_tls
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class ConnectionOpener:
    """Opens connections for `owner` (the transport: their datagrams, requests and closes go
    to it) with this node's `key` and `admission`."""

    def __init__(self, owner: ConnectionOwner, key: NodeKey, admission: Admission,
                 config: TransportConfig, clock: Clock, stats: NetStats) -> None:
        self.owner = owner
        self.config = config
        self.clock = clock
        self.stats = stats
        cert = make_self_signed_cert(key)
        self.handshake = HandshakeConfig(key, cert, admission, clock, config.handshake_timeout)
        self.client_ctx = client_ssl_context()
        self.server_ctx = server_ssl_context(key, cert)  # (the listener's)

    async def accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: HeldSlot
    ) -> PeerConnection | None:
        """The connection an inbound stream authenticated as; None when its handshake was
        refused or failed, or it was a dial-back probe (answered, closed). Gives `slot`
        (its place among the connections mid-handshake) back once the handshake ends."""
        set_nodelay(writer)
        try:
            peer, framed, probe, member = await server_handshake(reader, writer,
                                                                 self.handshake)
        except HandshakeRefused as exc:
            self.stats.handshakes_refused[exc.code] += 1
            log.info("refused an inbound connection: %s", exc.reason)
            await close_writer(writer)
            return None
        except (ConnectionError, OSError, TimeoutError):
            self.stats.handshakes_refused["closed"] += 1
            await close_writer(writer)
            return None
        finally:
            slot.release()
        self.stats.handshakes_ok += 1
        if probe:
            await close_writer(writer)
            return None
        return self._connection(framed, writer, peer, member, dialled=False)

    async def dial(self, addr: str, expected: str | None, *,
                   probe: bool = False) -> PeerConnection:
        """Connect to `addr` and authenticate it (as `expected` when given). Raises
        PeerUnreachable, or HandshakeRefused (counted)."""
        try:
            host, port = parse_addr(addr)
        except ValueError as exc:
            raise PeerUnreachable(str(exc)) from exc
        try:
            reader, writer = await open_tls(
                host,
                port,
                self.client_ctx,
                self.clock,
                self.config.connect_timeout,
                self.config.handshake_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise PeerUnreachable(f"cannot connect to {addr}: {exc or type(exc).__name__}") from exc
        set_nodelay(writer)
        try:
            peer, framed, member = await client_handshake(reader, writer, self.handshake,
                                                          expected, probe=probe)
        except HandshakeRefused as exc:
            self.stats.handshakes_refused[exc.code] += 1
            await close_writer(writer)
            raise
        except (ConnectionError, OSError) as exc:
            await close_writer(writer)
            raise PeerUnreachable(f"connection to {addr} failed in handshake: {exc}") from exc
        except BaseException:
            await close_writer(writer)
            raise
        self.stats.handshakes_ok += 1
        return self._connection(framed, writer, peer, member, dialled=True)

    def _connection(self, framed: FramedReader, writer: asyncio.StreamWriter, peer: str,
                    member: str, *, dialled: bool) -> PeerConnection:
        return PeerConnection(
            self.owner,
            framed,
            writer,
            peer,
            dialled=dialled,
            clock=self.clock,
            keepalive=self.config.keepalive,
            probe=self.config.probe_timeout,
            member=member,
        )


async def close_writer(writer: asyncio.StreamWriter) -> None:
    # (closing a connection that already failed: the caller reports that failure)
    with contextlib.suppress(Exception):
        writer.close()
        await with_timeout(SystemClock(), writer.wait_closed(), 1.0)
