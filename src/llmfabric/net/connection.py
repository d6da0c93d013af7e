"""An established, authenticated peer connection: frame dispatch, datagrams, two h2 sessions,
keep-alive pings.

The owner (the transport) gets callbacks through `ConnectionOwner`; writes are synchronous
appends to the TLS stream's buffer, so `send_datagram` never blocks: over the write-buffer
limit it drops and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine
from typing import Any, Protocol

from llmfabric.clock import Clock, with_timeout
from llmfabric.net.errors import FrameError, PeerClosed, RequestFailed
from llmfabric.net.framing import (
    FrameType,
    append_frame,
    decode_routed,
    encode_frame,
    encode_routed,
)
from llmfabric.net.h2endpoint import H2Endpoint
from llmfabric.net.handshake import FramedReader
from llmfabric.net.messages import BodyStream, Headers
from llmfabric.net.source_slots import peer_ip
from llmfabric.net.stats import NetStats
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

# CLOSE payload meaning "I had no open streams": the receiver's unanswered requests were never
# seen and may be retried (PeerClosed). An empty CLOSE promises nothing.
CLOSE_IDLE = b"idle"
# How long closing waits for the peer to finish TLS's close: past it the socket is cut.
CLOSE_GRACE_S = 2.0
WRITE_BUFFER_LIMIT = 1 << 20  # per connection; datagrams over it are dropped (queue_full)
COALESCE_LIMIT = 256 << 10
_PING = int(FrameType.PING)  # frame types below this are traffic (keep-alive is not)
_DGRAM = int(FrameType.DGRAM)


class ConnectionOwner(Protocol):
    stats: NetStats

    def on_datagram(self, src: str, payload: bytes, via: str | None) -> None: ...

    def on_relay_datagram(self, conn: PeerConnection, dst: str, payload: bytes) -> None: ...

    def on_request(
        self, conn: PeerConnection, sid: int, headers: Headers, body: BodyStream
    ) -> None: ...

    def on_stream_reset(self, conn: PeerConnection, sid: int) -> None: ...

    def on_closed(self, conn: PeerConnection) -> None: ...


def set_nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class PeerConnection:
    def __init__(
        self,
        owner: ConnectionOwner,
        framed: FramedReader,
        writer: asyncio.StreamWriter,
        peer_id: str,
        *,
        dialled: bool,
        clock: Clock,
        keepalive: float = 15.0,
        probe: float | None = None,
        member: str = "",
    ) -> None:
        self.owner = owner
        self.peer_id = peer_id
        # Who the peer's admission vouches for beyond its key: a certificate's provider (its
        # peer id when the certificate names none); "" on a PSK network (relay fair shares).
        self.member = member
        self.dialled = dialled
        self.source = peer_ip(writer.transport)  # what per-address caps count it against
        self._framed = framed
        self._writer = writer
        self._clock = clock
        self._keepalive = keepalive
        self._probe = probe  # see `watch`
        self._last_rx = clock.now()
        self.rx_reads = 0  # reads that returned bytes (a probe's evidence of life)
        self._probing = False
        self._watching = False
        self.last_used = self._last_rx  # last datagram/request frame either way (not pings)
        self._closing = False
        # The connection ended without a CLOSE frame from the peer and without us closing it
        # (EOF, reset, keep-alive silence): the peer's process may have died (kill -9).
        self.lost = False
        self._out = bytearray()
        self._out_base = 0  # TLS stream's buffered bytes when this iteration's batch began
        self._touched = False  # a traffic frame was sent since the last flush
        self.closed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.client = H2Endpoint(
            client_side=True,
            emit=lambda b: self.send_frame(FrameType.H2_TO_SERVER, b),
            drain=self.drain,
            on_dead=self._h2_dead,
            name=peer_id,
        )
        self.server = H2Endpoint(
            client_side=False,
            emit=lambda b: self.send_frame(FrameType.H2_TO_CLIENT, b),
            drain=self.drain,
            on_request=lambda sid, h, body: owner.on_request(self, sid, h, body),
            on_reset=lambda sid: owner.on_stream_reset(self, sid),
            on_dead=self._h2_dead,
            name=peer_id,
        )

    def _h2_dead(self) -> None:
        self.owner.stats.drop("garbled")
        self._begin_close()

    def start(self) -> None:
        set_nodelay(self._writer)
        self.client.start()
        self.server.start()
        self.spawn(self._read_loop())
        self.spawn(self._ping_loop())

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.owner.stats.error("connection_task")
            log.error("connection task %s for %s failed", task.get_name(), self.peer_id,
                      exc_info=exc)
            self._begin_close()

    @property
    def busy(self) -> bool:
        """True while requests are in flight on either h2 session."""
        return self.client.open_streams > 0 or self.server.open_streams > 0

    @property
    def is_open(self) -> bool:
        return not self._closing

    # -- writing -----------------------------------------------------------------------------
    # Frames written in one loop iteration are appended to `_out` and go to the TLS stream
    # as ONE write at the end of the iteration (one TLS record and syscall for many small
    # datagrams or h2 frames). The TLS stream's own buffer is read once per iteration too.
    def send_frame(self, ftype: int, payload: bytes) -> bool:
        if self._closing:
            return False
        out = self._out
        if not out:
            self._start_batch()
        if ftype < _PING:  # keep-alive frames do not make a connection "used"
            self._touched = True
        self.owner.stats.bytes_sent += append_frame(out, ftype, payload)
        if len(out) >= COALESCE_LIMIT:
            self._flush_out()
        return True

    def _start_batch(self) -> None:
        self._out_base = self._writer.transport.get_write_buffer_size()
        asyncio.get_running_loop().call_soon(self._flush_out)

    def _flush_out(self) -> None:
        if self._touched:
            self._touched = False
            self.last_used = self._clock.now()
        if self._out and not self._closing:
            # On a broken connection the read loop notices and closes it.
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                self._writer.write(bytes(self._out))
        self._out.clear()

    def send_datagram(self, payload: bytes) -> bool:
        """Write a DGRAM frame; False (and counted) when dropped: closed or buffer full."""
        return self._send_dgram(_DGRAM, payload)

    def send_routed(self, ftype: int, peer: str, payload: bytes) -> bool:
        return self._send_dgram(ftype, encode_routed(peer, payload))

    def _send_dgram(self, ftype: int, payload: bytes) -> bool:
        stats = self.owner.stats
        if self._closing:
            stats.drop("unreachable")
            return False
        out = self._out
        if not out:
            self._start_batch()
        if self._out_base + len(out) > WRITE_BUFFER_LIMIT:
            stats.drop("queue_full")
            return False
        self._touched = True
        stats.bytes_sent += append_frame(out, ftype, payload)
        stats.datagrams_sent += 1
        if len(out) >= COALESCE_LIMIT:
            self._flush_out()
        return True

    async def drain(self) -> None:
        if self._closing:
            return
        self._flush_out()
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            self._begin_close()

    # -- reading -----------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        stats = self.owner.stats
        try:
            while True:
                # Frames decoded during the handshake come first.
                while self._framed.pending:
                    frame = self._framed.pending.pop(0)
                    self._dispatch(frame.type, frame.payload)
                data = await self._framed.reader.read(65536)
                if not data:
                    self.lost = not self._closing
                    break
                stats.bytes_received += len(data)
                self._last_rx = self._clock.now()
                self.rx_reads += 1
                for frame in self._framed.decoder.feed(data):
                    self._dispatch(frame.type, frame.payload)
                    if self._closing:
                        return
        except FrameError as exc:
            stats.drop(exc.code)
        except (ConnectionError, OSError):
            self.lost = not self._closing
        finally:
            self._begin_close()

    def _dispatch(self, ftype: int, payload: bytes) -> None:
        stats = self.owner.stats
        if ftype < _PING:
            self.last_used = self._last_rx
        if ftype == _DGRAM:
            stats.datagrams_received += 1
            self.owner.on_datagram(self.peer_id, payload, None)
        elif ftype == FrameType.H2_TO_SERVER:
            self.server.feed(payload)
        elif ftype == FrameType.H2_TO_CLIENT:
            self.client.feed(payload)
        elif ftype in (FrameType.RELAY_DGRAM, FrameType.RELAYED_DGRAM):
            try:
                peer, body = decode_routed(payload)
            except FrameError:
                stats.drop("garbled")
                return
            if ftype == FrameType.RELAY_DGRAM:
                self.owner.on_relay_datagram(self, peer, body)
            else:
                stats.datagrams_received += 1
                self.owner.on_datagram(peer, body, self.peer_id)
        elif ftype == FrameType.PING:
            self.send_frame(FrameType.PONG, payload)
        elif ftype == FrameType.PONG:
            pass
        elif ftype == FrameType.CLOSE and payload == CLOSE_IDLE:
            self._begin_close(PeerClosed(f"{self.peer_id} closed the idle connection first"))
        elif ftype in (FrameType.CLOSE, FrameType.REFUSE):
            self._begin_close()
        else:
            stats.drop("unknown_type")

    async def _ping_loop(self) -> None:
        while True:
            await self._clock.sleep(self._keepalive)
            if self._closing:
                return
            if self._clock.now() - self._last_rx > 3 * self._keepalive:
                self.lost = True
                self._begin_close()  # peer silent for 3 intervals: dead
                return
            self.send_frame(FrameType.PING, b"")

    def watch(self) -> None:
        """A request of ours is about to wait on this connection: while any does, silence
        longer than `probe` makes the connection probe itself, so a dead one (the answer's
        head came, then the partition) fails its requests in seconds, not 3 keep-alives."""
        if self._probe is not None and not self._watching and not self._closing:
            self._watching = True
            self.spawn(self._watch_loop(self._probe))

    async def _watch_loop(self, probe: float) -> None:
        try:
            while True:
                await self._clock.sleep(probe / 2)
                if self._closing or self.client.open_streams == 0:
                    return
                if self._clock.now() - self._last_rx >= probe:
                    self.probe(probe)
        finally:
            self._watching = False

    def probe(self, within: float) -> None:
        """A request on this connection got no answer in time: send a PING, and if nothing at
        all arrives within `within` seconds, the connection is dead without a FIN (a
        partition, a host gone): close it now rather than after 3 keep-alive intervals, so
        later requests dial again instead of queueing on it. One probe at a time."""
        if self._closing or self._probing:
            return
        self._probing = True
        self.send_frame(FrameType.PING, b"")
        self.spawn(self._probe_wait(self.rx_reads, within))

    async def _probe_wait(self, reads: int, within: float) -> None:
        try:
            await self._clock.sleep(within)
        finally:
            self._probing = False
        if not self._closing and self.rx_reads == reads:
            self.lost = True
            self.owner.stats.drop("probe_unanswered")
            self._begin_close()

    # -- closing -----------------------------------------------------------------------------
    def close_if_idle(self) -> bool:
        """Close now unless requests are in flight (checked and closed in one step, so no
        request can slip in between); the peer learns its unanswered requests were unseen."""
        if self._closing or self.busy:
            return False
        self.send_frame(FrameType.CLOSE, CLOSE_IDLE)
        self._begin_close()
        return True

    def _begin_close(self, err: RequestFailed | None = None) -> None:
        if self._closing:
            return
        self._flush_out()
        self._closing = True
        err = err or RequestFailed(f"connection to {self.peer_id} closed")
        self.client.fail(err)
        self.server.fail(err)
        with contextlib.suppress(Exception):  # (closing: `err` went to every stream above)
            self._writer.close()
        current = asyncio.current_task()
        for t in self._tasks:
            if t is not current:
                t.cancel()
        self.closed.set()
        self.owner.on_closed(self)

    async def aclose(self) -> None:
        if not self._closing:
            self._flush_out()
            with contextlib.suppress(Exception):  # (a courtesy to the peer; we close anyway)
                self._writer.write(encode_frame(FrameType.CLOSE, b""))
        self._begin_close()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await with_timeout(self._clock, self._writer.wait_closed(), CLOSE_GRACE_S)
        except TimeoutError:
            # A frozen or vanished peer never answers TLS's close_notify: asyncio would wait
            # its ssl_shutdown_timeout (30 s) for it, and a node's SIGTERM stop with it.
            self.owner.stats.drop("close_unanswered")
            self._writer.transport.abort()
        except Exception:
            pass  # (the connection is gone either way)
