"""PeerConnection (net/connection.py) on its own: a loopback TCP pair, the test writing raw
frames as the peer. Datagrams (direct, relayed, to be relayed) reach the owner; pings are
answered and do not count as use; hostile input (an unknown frame type, a garbled routed
datagram) is dropped and counted without closing, garbage framing closes and is counted; the
peer's CLOSE, EOF and keep-alive silence (on the FakeClock) close with `lost` telling a clean
close from a vanished peer; a closed connection drops and counts what it is asked to send."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmfabric.net.connection import CLOSE_IDLE, PeerConnection
from llmfabric.net.framing import Frame, FrameDecoder, FrameType, encode_frame, encode_routed
from llmfabric.net.handshake import FramedReader
from llmfabric.net.messages import BodyStream, Headers
from llmfabric.net.stats import NetStats
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.poll import wait_until

PEER = "peer-under-test"
KEEPALIVE = 15.0


@dataclass
class Owner:
    """Records what the connection hands its owner (the transport, in production)."""

    stats: NetStats = field(default_factory=NetStats)
    datagrams: list[tuple[str, bytes, str | None]] = field(default_factory=list)
    to_relay: list[tuple[str, bytes]] = field(default_factory=list)
    closed: list[PeerConnection] = field(default_factory=list)

    def on_datagram(self, src: str, payload: bytes, via: str | None) -> None:
        self.datagrams.append((src, payload, via))

    def on_relay_datagram(self, conn: PeerConnection, dst: str, payload: bytes) -> None:
        self.to_relay.append((dst, payload))

    def on_request(self, conn: PeerConnection, sid: int, headers: Headers,
                   body: BodyStream) -> None:
        raise AssertionError("no requests in these tests")

    def on_stream_reset(self, conn: PeerConnection, sid: int) -> None:
        pass

    def on_closed(self, conn: PeerConnection) -> None:
        self.closed.append(conn)


@dataclass
class Pair:
    conn: PeerConnection
    owner: Owner
    clock: FakeClock
    peer_in: FramedReader  # what the connection wrote, as frames
    peer_out: asyncio.StreamWriter

    def write(self, ftype: int, payload: bytes = b"") -> None:
        self.peer_out.write(encode_frame(ftype, payload))

    async def next_frame(self) -> Frame | None:
        """The next frame the connection wrote, past its two h2 sessions' own frames."""
        while True:
            frame = await asyncio.wait_for(self.peer_in.read_frame(), 10)
            if frame is None or frame.type not in (FrameType.H2_TO_SERVER,
                                                   FrameType.H2_TO_CLIENT):
                return frame


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[Pair]:
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future())

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.set_result((r, w))

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    peer_r, peer_w = await asyncio.wait_for(accepted, 10)
    owner, clock = Owner(), FakeClock()
    conn = PeerConnection(owner, FramedReader(reader, FrameDecoder()), writer, PEER,
                          dialled=True, clock=clock, keepalive=KEEPALIVE)
    conn.start()
    try:
        yield Pair(conn, owner, clock, FramedReader(peer_r, FrameDecoder()), peer_w)
    finally:
        await conn.aclose()
        peer_w.close()
        server.close()
        await server.wait_closed()


async def test_datagrams_direct_relayed_and_to_relay_reach_the_owner() -> None:
    async with pair() as p:
        p.write(FrameType.DGRAM, b"hello")
        p.write(FrameType.RELAYED_DGRAM, encode_routed("origin", b"via you"))
        p.write(FrameType.RELAY_DGRAM, encode_routed("onward", b"please forward"))
        await wait_until(lambda: len(p.owner.datagrams) == 2 and p.owner.to_relay)
        assert p.owner.datagrams == [(PEER, b"hello", None), ("origin", b"via you", PEER)]
        assert p.owner.to_relay == [("onward", b"please forward")]
        assert p.owner.stats.datagrams_received == 2
        assert p.conn.send_datagram(b"back")
        frame = await p.next_frame()
        assert frame is not None and (frame.type, frame.payload) == (FrameType.DGRAM, b"back")
        assert p.owner.stats.datagrams_sent == 1


async def test_hostile_frames_are_dropped_and_counted_without_closing() -> None:
    async with pair() as p:
        p.write(200, b"from the future")  # an unknown frame type
        p.write(FrameType.RELAYED_DGRAM, b"\x00")  # shorter than its header
        p.write(FrameType.RELAY_DGRAM, b"\x00\x09abc")  # peer id longer than the payload
        p.write(FrameType.DGRAM, b"still here")
        await wait_until(lambda: p.owner.datagrams)
        assert p.owner.stats.dropped == {"unknown_type": 1, "garbled": 2}
        assert p.owner.datagrams == [(PEER, b"still here", None)] and not p.owner.to_relay
        assert p.conn.is_open


async def test_garbage_framing_closes_the_connection_and_is_counted() -> None:
    async with pair() as p:
        p.peer_out.write(b"\xff" * 32)
        await asyncio.wait_for(p.conn.closed.wait(), 10)
        assert p.owner.stats.dropped["wrong_version"] == 1
        assert p.owner.closed == [p.conn] and not p.conn.lost
        assert not p.conn.send_datagram(b"too late")
        assert p.owner.stats.dropped["unreachable"] == 1


async def test_pings_are_answered_and_do_not_count_as_use() -> None:
    async with pair() as p:
        await p.clock.advance(5)
        p.write(FrameType.PING, b"n1")
        frame = await p.next_frame()
        assert frame is not None and (frame.type, frame.payload) == (FrameType.PONG, b"n1")
        assert p.conn.last_used == 0.0  # keep-alive traffic: still idle since the start
        p.write(FrameType.DGRAM, b"x")
        await wait_until(lambda: p.owner.datagrams)
        assert p.conn.last_used == 5.0


async def test_a_silent_peer_is_declared_lost_after_three_keepalives() -> None:
    async with pair() as p:
        await p.clock.advance(KEEPALIVE)
        frame = await p.next_frame()  # the connection pings the peer every interval
        assert frame is not None and frame.type == FrameType.PING
        await p.clock.advance(2 * KEEPALIVE)
        assert p.conn.is_open  # 3 intervals of silence are tolerated
        await p.clock.advance(2 * KEEPALIVE)
        await asyncio.wait_for(p.conn.closed.wait(), 10)
        assert p.conn.lost and p.owner.closed == [p.conn]


async def test_close_eof_and_idle_close_tell_lost_from_clean() -> None:
    async with pair() as p:
        p.write(FrameType.CLOSE)
        await asyncio.wait_for(p.conn.closed.wait(), 10)
        assert not p.conn.lost
    async with pair() as p:
        p.write(FrameType.CLOSE, CLOSE_IDLE)
        await asyncio.wait_for(p.conn.closed.wait(), 10)
        assert not p.conn.lost
    async with pair() as p:
        p.peer_out.close()  # EOF without a CLOSE frame: the peer may have died
        await asyncio.wait_for(p.conn.closed.wait(), 10)
        assert p.conn.lost


async def test_close_if_idle_announces_the_idle_close_to_the_peer() -> None:
    async with pair() as p:
        assert p.conn.close_if_idle()
        frame = await p.next_frame()
        assert frame is not None and (frame.type, frame.payload) == (FrameType.CLOSE,
                                                                     CLOSE_IDLE)
        assert not p.conn.is_open and not p.conn.close_if_idle()  # once
