"""`TlsTransport`: the real peer network on asyncio (TLS 1.3 over TCP, pinned peer ids).

One object per node. It is a `Transport` (datagrams for gossip/membership) and also offers the
peer request API (`request` / `set_request_handler`), bootstrap with backoff, a dial-back
reachability check and relays for nodes that cannot be dialled. See docs/network.md.

Usage::

    async with TlsTransport(key, PskAdmission("net", secret), TransportConfig(port=7000)) as t:
        t.set_handler(on_message)
        t.set_request_handler(serve)
        await t.bootstrap(["10.0.0.1:7000"])
        resp = await t.request(peer_id, "POST", "/v1/chat/completions", (), body)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.identity.admission import Admission
from llmfabric.identity.keys import NodeKey
from llmfabric.net.addressbook import AddressBook, host_addrs
from llmfabric.net.backoff import Backoff
from llmfabric.net.bootstrap import run_bootstrap
from llmfabric.net.config import TransportConfig as TransportConfig
from llmfabric.net.connection import PeerConnection
from llmfabric.net.errors import (
    HandshakeRefused,
    NetError,
    PeerClosed,
    PeerUnreachable,
    RequestFailed,
)
from llmfabric.net.framing import FrameType
from llmfabric.net.limits import ConnectionLimits
from llmfabric.net.messages import (
    Body,
    BodyStream,
    Headers,
    PeerResponse,
    RequestHandler,
)
from llmfabric.net.opener import ConnectionOpener
from llmfabric.net.relay import RelayService
from llmfabric.net.relay_methods import RelayMethods
from llmfabric.net.serving import RELAY_ERROR, RELAY_TO, serve_request
from llmfabric.net.source_slots import HeldSlot, SourceSlots
from llmfabric.net.stats import NetStats
from llmfabric.net.tlsstream import start_tls_server
from llmfabric.net.transport import MessageHandler, PeerId, Transport
from llmfabric.untrusted import get_logger, log_due

log = get_logger(__name__)

RETIRE_QUIET = 2.0


class TlsTransport(RelayMethods):
    def __init__(
        self,
        key: NodeKey,
        admission: Admission,
        config: TransportConfig | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.key = key
        self.admission = admission
        self.config = config or TransportConfig()
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.stats = NetStats()
        self.book = AddressBook()
        # TLS and the application handshake, both ways (opener.py)
        self.opener = ConnectionOpener(self, key, admission, self.config, self.clock,
                                       self.stats)
        self._server: asyncio.Server | None = None
        self._bound: str | None = None
        self._guessed: tuple[str, ...] | None = None
        self._conns: dict[str, PeerConnection] = {}
        self._all_conns: set[PeerConnection] = set()
        self._dialing: dict[str, asyncio.Future[PeerConnection]] = {}
        self._pending: dict[str, list[bytes]] = {}
        self._serving: dict[tuple[int, int], asyncio.Task[Any]] = {}
        self._direct_failed: dict[str, float] = {}  # peer -> clock time to retry direct dial
        self._tasks: set[asyncio.Task[Any]] = set()
        self._handler: MessageHandler | None = None
        self._request_handler: RequestHandler | None = None
        self._peer_lost: Callable[[str], None] | None = None
        self._closing = False
        # Peers whose membership was revoked: their handshakes fail (admission), and what a
        # relay still forwards from them is dropped (`refuse_peers`).
        self.refused: frozenset[str] = frozenset()
        self.relay = RelayService(self)
        self.limits = ConnectionLimits(self)
        # inbound connections mid-handshake (TransportConfig.max_handshakes*)
        self.handshaking = SourceSlots(
            self.config.max_handshakes, self.config.max_handshakes_per_ip,
            on_refused=lambda: self.stats.handshakes_refused.update(("busy",)),
        )

    # -- Transport protocol ------------------------------------------------------------------
    @property
    def local_id(self) -> PeerId:
        return self.key.peer_id

    def set_handler(self, handler: MessageHandler) -> None:
        self._handler = handler

    def send(self, peer: PeerId, payload: bytes) -> None:
        """Best effort, never blocks: send now, or queue while connecting, or drop and count."""
        if self._closing:
            self.stats.drop("closed")
            return
        conn = self._conns.get(peer)
        if conn is not None and conn.is_open:
            conn.send_datagram(payload)  # counts a drop itself
            return
        book = self.book.get(peer)
        if not book.addrs and not book.relays:
            self.stats.drop("unreachable")
            return
        queue = self._pending.setdefault(peer, [])
        if len(queue) >= self.config.max_pending_per_peer:
            self.stats.drop("queue_full")
            return
        queue.append(payload)
        if len(queue) == 1:
            self.spawn(self._deliver_pending(peer))

    async def _deliver_pending(self, peer: str) -> None:
        try:
            conn = await self._ensure_conn(peer)
            ftype, via_peer = FrameType.DGRAM, None
        except NetError:
            relay_conn = await self.relay.connection_to_a_relay_of(peer)
            if relay_conn is None:
                self.stats.drop("unreachable", len(self._pending.pop(peer, [])))
                return
            conn, ftype, via_peer = relay_conn, FrameType.RELAY_DGRAM, peer
        for payload in self._pending.pop(peer, []):
            if via_peer is None:
                conn.send_datagram(payload)
            else:
                conn.send_routed(ftype, via_peer, payload)

    # -- requests ----------------------------------------------------------------------------
    def set_request_handler(self, handler: RequestHandler) -> None:
        """Install `async handler(PeerRequest) -> HandlerResponse` for requests from peers."""
        self._request_handler = handler

    async def request(
        self,
        peer_id: PeerId,
        method: str,
        path: str,
        headers: Headers | Sequence[tuple[str, str]] = (),
        body: Body = b"",
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 - runs on the injected clock
    ) -> PeerResponse:
        """Send a request to `peer_id` (directly if dialable, else through one of its relays).

        `timeout` bounds the time until the response headers; the body then streams without
        a deadline. Raises PeerUnreachable or RequestFailed.
        """
        self.stats.requests_sent += 1
        try:
            return await with_timeout(
                self.clock, self._request(peer_id, method, path, tuple(headers), body), timeout
            )
        except TimeoutError as exc:
            raise RequestFailed(f"no response from {peer_id} within {timeout}s") from exc

    async def _request(
        self, peer_id: str, method: str, path: str, headers: Headers, body: Body
    ) -> PeerResponse:
        direct_error: NetError | None = None
        try:
            conn = await self._ensure_conn(peer_id)
        except NetError as exc:
            direct_error = exc
        else:
            status, rh, stream = await self._send_on(conn, method, path, headers, body)
            return PeerResponse(status, rh, stream, peer_id, None)
        for relay_id in self.relay.relays_of(peer_id):
            try:
                rconn = await self._ensure_conn(relay_id)
            except NetError:
                continue
            hdrs = (*headers, (RELAY_TO, peer_id))
            try:
                status, rh, stream = await self._send_on(rconn, method, path, hdrs, body)
            except NetError as exc:
                direct_error = exc
                continue
            if status == 502 and any(k == RELAY_ERROR for k, _ in rh):
                stream.abort()
                continue
            return PeerResponse(status, rh, stream, peer_id, relay_id)
        raise PeerUnreachable(
            f"cannot reach {peer_id}: direct: {direct_error}; relays tried: "
            f"{list(self.relay.relays_of(peer_id)) or 'none known'}"
        )

    async def _send_on(
        self, conn: PeerConnection, method: str, path: str, headers: Headers, body: Body
    ) -> tuple[int, Headers, BodyStream]:
        conn.watch()
        try:
            status, rh, stream, _ = await conn.client.request(
                method, path, conn.peer_id, headers, body
            )
        except asyncio.CancelledError:
            # The caller's timeout (or the caller) gave up waiting: make sure the connection
            # is not silently dead, or every later request would wait on it too.
            conn.probe(self.config.probe_timeout)
            raise
        except PeerClosed:
            # The peer closed this idle connection before it saw the request: nothing was
            # processed, so send it once more on a fresh connection (bytes bodies only).
            if not isinstance(body, bytes):
                raise
            conn = await self._ensure_conn(conn.peer_id)
            status, rh, stream, _ = await conn.client.request(
                method, path, conn.peer_id, headers, body
            )
        return status, rh, stream

    def on_request(
        self, conn: PeerConnection, sid: int, headers: Headers, body: BodyStream
    ) -> None:
        key = (id(conn), sid)
        task = self.spawn(serve_request(self, conn, sid, headers, body))
        self._serving[key] = task
        task.add_done_callback(lambda _t: self._serving.pop(key, None))

    def on_stream_reset(self, conn: PeerConnection, sid: int) -> None:
        """The caller gave up on a request: cancel its handler."""
        task = self._serving.pop((id(conn), sid), None)
        if task is not None:
            task.cancel()

    # -- datagrams in ------------------------------------------------------------------------
    def on_datagram(self, src: str, payload: bytes, via: str | None) -> None:
        if via is not None and not self.relay.is_my_relay(via):
            self.stats.drop("untrusted_relay")
            return
        if src in self.refused:
            self.stats.drop("revoked")
            return
        if self._handler is None:
            self.stats.drop("no_handler")
            return
        try:
            self._handler(src, payload)
        except Exception as exc:
            self.stats.error("message_handler")
            n = self.stats.errors["message_handler"]
            if log_due(n):  # (a peer can resend a message that fails at will: no log flood)
                log.error("message handler failed on a %d-byte message from %s%s: %r; %d "
                          "failure(s) so far (llmfabric_net_errors{where=message_handler})",
                          len(payload), src, f" via {via}" if via else "", exc, n,
                          exc_info=n == 1)

    def on_relay_datagram(self, conn: PeerConnection, dst: str, payload: bytes) -> None:
        self.relay.forward_datagram(conn, dst, payload)

    # -- connections -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start listening (unless config.host is None)."""
        if self.config.host is None or self._server is not None:
            return
        self._server = await start_tls_server(
            self._on_accept, self.config.host, self.config.port, self.opener.server_ctx,
            handshake_timeout=self.config.handshake_timeout, slots=self.handshaking,
        )
        sock = self._server.sockets[0].getsockname()
        host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
        self._bound = f"{host}:{sock[1]}"
        if sock[0] in ("0.0.0.0", "::"):
            self._guessed = await host_addrs(int(sock[1]))

    @property
    def listen_addr(self) -> str | None:
        """The bound "host:port", or None when not listening."""
        return self._bound

    @property
    def advertised_addrs(self) -> tuple[str, ...]:
        """Addresses to publish in NodeMeta.peer_addrs (empty when not listening)."""
        if self.config.public_addr:
            return (self.config.public_addr,)
        if self._bound is None:
            return ()
        if self._guessed is not None:  # wildcard listen: this host's non-loopback addresses
            return self._guessed
        return (self._bound,)

    def connected_peers(self) -> tuple[str, ...]:
        return tuple(p for p, c in self._conns.items() if c.is_open)

    def add_peer(self, peer_id: str, addrs: Iterable[str] = (), relays: Iterable[str] = ()) -> None:
        """Set where `peer_id` is reached (from its registry record: peer_addrs, relays)."""
        if peer_id != self.local_id:
            before = self.book.get(peer_id).addrs
            self.book.set(peer_id, addrs, relays)
            if self.book.get(peer_id).addrs != before:  # new addresses: try direct again
                self._direct_failed.pop(peer_id, None)

    def refuse_peers(self, peers: Iterable[str]) -> int:
        """From now on drop datagrams and requests a relay forwards from `peers` (their
        membership was revoked), and close every connection with them at once (requests in
        flight on them fail). Returns how many connections were closed."""
        self.refused = frozenset(peers)
        return sum(self.disconnect(peer) for peer in self.refused)

    def disconnect(self, peer_id: str) -> int:
        """Close every connection with `peer_id` now and forget its addresses (requests in
        flight on them fail). Returns how many connections were closed."""
        closed = [c for c in self._all_conns if c.peer_id == peer_id and c.is_open]
        for conn in closed:
            self.spawn(conn.aclose())
        self.remove_peer(peer_id)
        self.stats.drop("closed", len(self._pending.pop(peer_id, [])))
        return len(closed)

    def remove_peer(self, peer_id: str) -> None:
        """Forget where `peer_id` is reached (it left the fabric); an open connection stays
        until it closes or idles out."""
        self.book.remove(peer_id)
        self._direct_failed.pop(peer_id, None)

    async def _on_accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: HeldSlot
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._closing:
            writer.close()
            return
        try:
            await self._accept(reader, writer, slot)
        except asyncio.CancelledError:
            # Transport closing mid-handshake (or while closing a refused connection). End
            # quietly: asyncio's server callback fails on a cancelled connection task.
            writer.close()

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: HeldSlot
    ) -> None:
        conn = await self.opener.accept(reader, writer, slot)
        if conn is not None:
            self._register(conn)

    async def _open(
        self, addr: str, expected: str | None, *, probe: bool = False
    ) -> PeerConnection:
        if self._closing:
            raise PeerUnreachable("transport is closing")
        return await self.opener.dial(addr, expected, probe=probe)

    async def probe(self, addr: str, expected: str) -> None:
        """Dial `addr`, check it answers as `expected`, close. Raises NetError on failure."""
        conn = await self._open(addr, expected, probe=True)
        await conn.aclose()

    async def connect(self, addr: str, expected_peer: str | None = None) -> str:
        """Dial `addr` (pinning `expected_peer` if given); return the authenticated peer id."""
        conn = await self._open(addr, expected_peer)
        self.book.learn_addr(conn.peer_id, addr)
        return self._register(conn).peer_id

    async def connect_bootstrap(self, addr: str) -> str:
        """Connect to a bootstrap peer; return the peer id learnt from its certificate (our
        own when the address is this node's: it answered, but no connection is made)."""
        try:
            return await self.connect(addr)
        except HandshakeRefused as exc:
            if exc.code == "self":
                return self.local_id
            raise

    async def bootstrap(self, addrs: Sequence[str], *, max_rounds: int | None = None) -> list[str]:
        """Connect to every reachable bootstrap address; while none answers, retry after
        exponential backoff with full jitter (clock + rng injected). Returns the peer ids."""
        backoff = Backoff(self.config.backoff_base, self.config.backoff_cap, self.rng)
        return await run_bootstrap(self.connect_bootstrap, addrs, self.clock, backoff, max_rounds)

    def _register(self, conn: PeerConnection) -> PeerConnection:
        if self._closing:
            self.spawn(conn.aclose())
            return conn
        self.stats.connections_opened += 1
        self._all_conns.add(conn)
        conn.start()
        self.limits.start()
        old = self._conns.get(conn.peer_id)
        if old is not None and old.is_open:
            # Both sides dialled at once: keep the connection dialled by the lower peer id.
            if self._dialler(conn) <= self._dialler(old):
                self._conns[conn.peer_id] = conn
                self.spawn(self._retire(old))
                return conn
            self.spawn(self._retire(conn))
            return old
        self._conns[conn.peer_id] = conn
        self.limits.enforce_cap(keep=conn)
        return conn

    async def _retire(self, conn: PeerConnection, grace: float = 60.0) -> None:
        """Close a duplicate connection once it has been quiet for RETIRE_QUIET seconds with
        nothing in flight (or after `grace` seconds); it keeps delivering what arrives
        meanwhile. The quiet time lets requests the peer sent on it before it saw the other
        connection arrive and finish instead of being cut off."""
        deadline = self.clock.now() + grace
        while conn.is_open and self.clock.now() < deadline:
            quiet = self.clock.now() - conn.last_used >= RETIRE_QUIET
            if quiet and conn.close_if_idle():
                break
            await self.clock.sleep(0.5)
        await conn.aclose()

    def _dialler(self, conn: PeerConnection) -> str:
        return self.local_id if conn.dialled else conn.peer_id

    def on_peer_lost(self, callback: Callable[[str], None] | None) -> None:
        """Call `callback(peer_id)` when the connection in use with a peer ends without the
        peer closing it (EOF or reset without a CLOSE frame, or keep-alive silence): its
        process may have died, so membership can probe it now instead of in its turn."""
        self._peer_lost = callback

    def on_closed(self, conn: PeerConnection) -> None:
        if conn not in self._all_conns:  # a dial-back probe, never registered
            return
        if not self._closing:  # finish closing (await the socket) in the background
            task = self.spawn(conn.aclose())
            task.add_done_callback(lambda _t: self._all_conns.discard(conn))
        current = self._conns.get(conn.peer_id) is conn
        if current:
            del self._conns[conn.peer_id]
        self.relay.on_closed(conn)
        if current and conn.lost and not self._closing:
            self.stats.peers_lost += 1
            if self._peer_lost is not None:
                try:
                    self._peer_lost(conn.peer_id)
                except Exception as exc:
                    self.stats.error("peer_lost_callback")
                    n = self.stats.errors["peer_lost_callback"]
                    if log_due(n):  # (a peer can connect and drop again and again)
                        log.error("peer-lost callback failed for %s: %r; %d failure(s) so far "
                                  "(llmfabric_net_errors{where=peer_lost_callback})",
                                  conn.peer_id, exc, n, exc_info=n == 1)

    async def _ensure_conn(self, peer: str) -> PeerConnection:
        """An open connection to `peer`: the existing one, or dial its known addresses."""
        conn = self._conns.get(peer)
        if conn is not None and conn.is_open:
            return conn
        fut = self._dialing.get(peer)
        if fut is None:
            fut = asyncio.ensure_future(self._dial(peer))
            self._dialing[peer] = fut
            fut.add_done_callback(lambda f: self._dial_done(peer, f))
        return await asyncio.shield(fut)

    def _dial_done(self, peer: str, fut: asyncio.Future[PeerConnection]) -> None:
        self._dialing.pop(peer, None)
        if not fut.cancelled():
            fut.exception()  # retrieved here; awaiting callers get it too

    async def _dial(self, peer: str) -> PeerConnection:
        book = self.book.get(peer)
        if book.relays and self._direct_failed.get(peer, float("-inf")) > self.clock.now():
            raise PeerUnreachable(f"direct dial to {peer} failed recently; using its relays")
        errors: list[str] = []
        for addr in book.addrs:
            try:
                return self._register(await self._open(addr, peer))
            except NetError as exc:
                errors.append(f"{addr}: {exc}")
        if book.relays:  # do not pay the connect timeout on every request to a NATed peer
            self._direct_failed[peer] = self.clock.now() + self.config.direct_retry_after
        raise PeerUnreachable(
            f"no direct address reaches {peer}: {'; '.join(errors) or 'no addresses known'}"
        )

    def connection(self, peer: str) -> PeerConnection | None:
        conn = self._conns.get(peer)
        return conn if conn is not None and conn.is_open else None

    # -- lifecycle ---------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(_discard_from(self._tasks, self.stats))
        return task

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        await self.relay.aclose()
        for fut in list(self._dialing.values()):
            fut.cancel()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.aclose() for c in list(self._all_conns)), return_exceptions=True)
        await asyncio.gather(*list(self._dialing.values()), return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):  # (closing: its connections are gone already)
                await self._server.wait_closed()
        for queue in self._pending.values():
            self.stats.drop("closed", len(queue))
        self._pending.clear()

    async def __aenter__(self) -> TlsTransport:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _conforms(t: TlsTransport) -> Transport:
    return t  # mypy checks that TlsTransport implements the Transport protocol


def _discard_from(tasks: set[asyncio.Task[Any]], stats: NetStats) -> Any:
    def cb(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if not isinstance(exc, NetError):
                stats.error("task")
                log.error("background task %s failed", task.get_coro(), exc_info=exc)

    return cb

