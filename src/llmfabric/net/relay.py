"""Reachability (dial-back) and relays for nodes that cannot be dialled.

- Dial-back: a node asks a peer (usually a bootstrap) to dial its advertised address and
  check that it answers with the asker's peer id: POST /_llmfabric/dialback {addr}.
- Relay client: a node that cannot be dialled keeps a persistent OUTBOUND connection to each
  of its relays and registers (POST /_llmfabric/relay/register). The relay sends requests for
  it over that connection with its own h2 *client* session, which the node answers with its h2
  *server* session (HTTP/2 with roles reversed). Lost relay connections are re-established
  with backoff. `relays` lists the relays that reach the node now (for NodeMeta.relays).
- Relay server (TransportConfig.relay=True): requests carrying ``x-llmfabric-relay-to: PEER``
  are forwarded to PEER over its connection, with ``x-llmfabric-origin`` naming the
  authenticated sender; bodies stream both ways under HTTP/2 flow control. RELAY_DGRAM
  frames are forwarded as RELAYED_DGRAM frames naming the sender. Registrations are capped
  per source address and in all; a full relay shares its slots fairly between parties
  (fair_share.py), so a member with many addresses or keys cannot keep newcomers out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h2.exceptions
import msgpack

from llmfabric.net.backoff import Backoff
from llmfabric.net.connection import PeerConnection
from llmfabric.net.errors import NetError
from llmfabric.net.fair_share import FairShare, relay_party
from llmfabric.net.framing import FrameType
from llmfabric.net.messages import BodyStream, HandlerResponse, Headers
from llmfabric.net.source_slots import SourceSlots
from llmfabric.untrusted import get_logger

if TYPE_CHECKING:
    from llmfabric.net.tls_transport import TlsTransport

log = get_logger(__name__)

DIALBACK_PATH = "/_llmfabric/dialback"
_ANSWER_LIMIT = 64 * 1024  # a relay's answer to a registration or a dial-back request
REGISTER_PATH = "/_llmfabric/relay/register"
MAX_INTERNAL_BODY = 64 * 1024
# Requests one sender may have open through this relay: the relay reaches each client over one
# HTTP/2 connection of 100 streams, and one member holding 100 bodies open cut a NATed node
# off from everybody (its refusals were 500s, which no caller failed over on).
MAX_RELAYED_PER_SENDER = 16
DGRAM_RATE_PER_S = 500.0  # relayed datagrams per sender, after a burst of DGRAM_BURST
DGRAM_BURST = 1000.0
DIALBACK_BURST = 4.0  # dial-backs per asking peer at once, then one per interval
DIALBACK_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class Reachability:
    """Outcome of a dial-back check: `ok`, and in `reason` what happened (for logs)."""

    ok: bool
    reason: str


def _json_like(obj: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


class RelayService:
    def __init__(self, transport: TlsTransport) -> None:
        self.t = transport
        self._my_relays: set[str] = set()  # relays that accepted our registration
        self._clients: dict[str, str] = {}  # (relay role) peers registered with us -> source
        cfg = transport.config
        # Registrations per source address (a hard cap), and in all with fair shares per
        # party when full (fair_share.py: a party holding two fewer than the largest takes
        # the largest party's least recently used registration).
        self._client_slots = SourceSlots(None, cfg.relay_max_clients_per_ip,
                                         on_refused=lambda: transport.stats.drop("relay_full"))
        self._shares = FairShare(cfg.relay_max_clients)
        self._relaying: Counter[str] = Counter()  # (relay role) open relayed requests, by sender
        self._dialbacks: dict[str, tuple[float, float]] = {}  # peer -> (tokens, when)
        self._dgram_tokens: dict[str, tuple[float, float]] = {}  # sender -> (tokens, when)
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self.listener: Callable[[tuple[str, ...]], None] | None = None
        self._last_reported: tuple[str, ...] = ()

    # -- client side -------------------------------------------------------------------------
    @property
    def relays(self) -> tuple[str, ...]:
        return tuple(sorted(self._my_relays))

    def is_my_relay(self, peer: str) -> bool:
        return peer in self._my_relays

    def is_protected(self, peer: str) -> bool:
        """A relay registration connection (either end): never closed for idleness."""
        return peer in self._loops or peer in self._clients

    def relays_of(self, peer: str) -> tuple[str, ...]:
        return self.t.book.get(peer).relays

    async def connection_to_a_relay_of(self, peer: str) -> PeerConnection | None:
        for relay_id in self.relays_of(peer):
            try:
                return await self.t._ensure_conn(relay_id)
            except NetError:
                continue
        return None

    def use(self, relay_ids: Sequence[str]) -> None:
        """Keep a registered outbound connection to each relay (addresses from the book)."""
        for relay_id in relay_ids:
            if relay_id not in self._loops and relay_id != self.t.local_id:
                self._loops[relay_id] = self.t.spawn(self._maintain(relay_id))

    @property
    def in_use(self) -> tuple[str, ...]:
        """Relays we keep (or try to keep) a registration with, registered or not."""
        return tuple(sorted(self._loops))

    def drop(self, relay_ids: Sequence[str]) -> None:
        """Stop keeping a registration with these relays (they left, or never answer)."""
        changed = False
        for relay_id in relay_ids:
            task = self._loops.pop(relay_id, None)
            if task is not None:
                task.cancel()
            if relay_id in self._my_relays:
                self._my_relays.discard(relay_id)
                changed = True
        if changed:
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        now = self.relays
        if now != self._last_reported:
            self._last_reported = now
            if self.listener is not None:
                try:
                    self.listener(now)
                except Exception:
                    self.t.stats.error("relay_listener")
                    log.exception("relay listener failed on relays %s", list(now))

    async def wait_registered(self, count: int = 1) -> None:
        while len(self._my_relays) < count:
            self._changed.clear()
            await self._changed.wait()

    async def _maintain(self, relay_id: str) -> None:
        backoff = Backoff(self.t.config.backoff_base, self.t.config.backoff_cap, self.t.rng)
        while True:
            try:
                conn = await self.t._ensure_conn(relay_id)
                resp = await self.t.request(
                    relay_id, "POST", REGISTER_PATH, (), b"", timeout=self.t.config.internal_timeout
                )
                text = await resp.read(_ANSWER_LIMIT)
                if resp.status != 200:
                    raise NetError(f"relay {relay_id} refused: "
                                   f"{text[:200].decode(errors='replace')}")
                self._my_relays.add(relay_id)
                self._notify()
                backoff.reset()
                log.info("registered with relay %s", relay_id)
                await conn.closed.wait()
                log.info("lost relay %s; reconnecting", relay_id)
            except NetError as exc:
                log.info("relay %s unavailable: %s", relay_id, exc)
            self._my_relays.discard(relay_id)
            self._notify()
            await self.t.clock.sleep(backoff.next_delay())

    def on_closed(self, conn: PeerConnection) -> None:
        if self.t.connection(conn.peer_id) is None:
            self._my_relays.discard(conn.peer_id)
            self._unregister(conn.peer_id)
            self._notify()

    async def check_reachability(self, via: str, addr: str | None = None) -> Reachability:
        """Ask peer `via` to dial `addr` (default: our advertised address) and answer.
        Never raises NetError: a failure is `Reachability(False, reason)`."""
        target = addr or next(iter(self.t.advertised_addrs), None)
        if target is None:
            return Reachability(False, "this node does not listen: no address to dial back")
        body = _json_like({"addr": target})
        try:
            resp = await self.t.request(
                via, "POST", DIALBACK_PATH, (), body, timeout=self.t.config.internal_timeout
            )
            async with resp:
                data = await resp.read(_ANSWER_LIMIT)
        except NetError as exc:
            return Reachability(False, f"dial-back request to {via} failed: {exc}")
        if resp.status != 200:
            text = data[:200].decode(errors="replace")
            return Reachability(False, f"{via} answered {resp.status}: {text}")
        try:
            answer = msgpack.unpackb(data, raw=False)
            ok = answer.get("ok") is True
            reason = str(answer.get("reason", ""))[:200]
        except Exception:  # (a peer's garbage: msgpack raises many types; any shape decodes)
            return Reachability(False, f"{via} sent an undecodable dial-back answer")
        if ok:
            return Reachability(True, f"{via} dialled {target} and reached us")
        return Reachability(False, f"{via} could not dial {target}: {reason or 'no reason'}")

    # -- server side -------------------------------------------------------------------------
    async def handle_internal(
        self, conn: PeerConnection, method: str, path: str, body: BodyStream
    ) -> HandlerResponse:
        data = await _read_limited(body, MAX_INTERNAL_BODY)
        if path == DIALBACK_PATH:
            try:
                addr = str(msgpack.unpackb(data, raw=False)["addr"])
            except Exception:  # (a peer's garbage: msgpack raises many types, any shape decodes)
                return HandlerResponse(400, (), b"body must be msgpack {addr}")
            if not self._dialback_allowed(conn.peer_id):
                return HandlerResponse(429, (), b"one dial-back per peer every few seconds")
            try:
                await self.t.probe(addr, conn.peer_id)
            except NetError:
                # The error's text told open ports (a TLS error) from closed ones (refused):
                # any member scanned the node's own network, loopback included. The asker
                # learns only that we could not reach it as itself.
                return HandlerResponse(200, (), _json_like(
                    {"ok": False, "reason": "no handshake as you at that address"}))
            return HandlerResponse(200, (), _json_like({"ok": True}))
        if path == REGISTER_PATH:
            if not self.t.config.relay:
                return HandlerResponse(403, (), b"this node is not a relay (start it with relay)")
            if conn.peer_id in self._clients:
                self._shares.touch(conn.peer_id)
            elif not self._register(conn):
                log.info("relay full: refused to register %s (from %s)", conn.peer_id,
                         conn.source or "an unknown address")
                return HandlerResponse(503, (), b"relay full: no room for another client"
                                                b" (from your address, or for your share)")
            return HandlerResponse(200, (), b"registered")
        return HandlerResponse(404, (), f"unknown internal path {path}".encode())

    def _register(self, conn: PeerConnection) -> bool:
        """Register `conn`'s peer: under the per-source cap, and in a full relay only for a
        party holding fewer than its share, whose newcomer then takes the place of the
        largest party's least recently used client (its connection is closed: the client
        reconnects with backoff and is refused while its party holds the most)."""
        peer, source = conn.peer_id, conn.source
        if not self._client_slots.take(source):
            return False
        admitted, evicted = self._shares.admit(peer, relay_party(conn.member, source))
        if not admitted:
            self._client_slots.give_back(source)
            self.t.stats.drop("relay_full")
            return False
        self._clients[peer] = source
        if evicted is not None:
            self.t.stats.drop("relay_evicted")
            log.info("relay full: %s takes the place of %s (its party held the most)",
                     peer, evicted)
            self._unregister(evicted)
            out = self.t.connection(evicted)
            if out is not None:
                self.t.spawn(out.aclose())
        return True

    def _unregister(self, peer: str) -> None:
        source = self._clients.pop(peer, None)
        if source is not None:
            self._client_slots.give_back(source)
        self._shares.remove(peer)

    def _dialback_allowed(self, peer: str) -> bool:
        """A token bucket per asking peer: DIALBACK_BURST at once (a starting node tries each
        bootstrap peer up to 3 times), then one per DIALBACK_INTERVAL_S."""
        now = asyncio.get_running_loop().time()
        if len(self._dialbacks) > 4096:  # (forget the peers whose bucket is full again)
            full_s = DIALBACK_BURST * DIALBACK_INTERVAL_S
            self._dialbacks = {p: (n, t) for p, (n, t) in self._dialbacks.items()
                               if now - t < full_s}
        tokens, last = self._dialbacks.get(peer, (DIALBACK_BURST, now))
        tokens = min(DIALBACK_BURST, tokens + (now - last) / DIALBACK_INTERVAL_S)
        if tokens < 1:
            return False
        self._dialbacks[peer] = (tokens - 1, now)
        return True

    @property
    def clients(self) -> tuple[str, ...]:
        return tuple(sorted(self._clients))

    async def forward(
        self, conn: PeerConnection, method: str, path: str, headers: Headers, body: BodyStream
    ) -> HandlerResponse:
        from llmfabric.net.serving import ORIGIN, RELAY_ERROR, RELAY_TO

        target = dict(headers)[RELAY_TO]
        out = self.t.connection(target)
        # Only to registered clients: a peer that did not register takes the relay's own
        # connection for the sender (its origin header counts only from its relays), so a
        # member could have its requests counted as the relay's (e.g. the relay's ingress
        # session exchanges, rate limited per peer: 20 junk offers a minute locked it out).
        if not self.t.config.relay:
            reason = "not a relay"
        elif target not in self._clients:
            reason = f"{target} is not registered with this relay"
        elif out is None:
            reason = f"{target} is not connected"
        elif self._relaying[conn.peer_id] >= MAX_RELAYED_PER_SENDER:
            reason = f"{MAX_RELAYED_PER_SENDER} relayed requests of yours are open"
        else:
            reason = ""
        if reason or out is None:
            return HandlerResponse(502, ((RELAY_ERROR, reason),), reason.encode())
        self._shares.touch(target)  # (the last of its party's clients to make room)
        hdrs = (
            *((k, v) for k, v in headers if k not in (RELAY_TO, ORIGIN)),
            (ORIGIN, conn.peer_id),
        )
        self.t.stats.requests_relayed += 1
        sender = conn.peer_id
        self._relaying[sender] += 1
        try:
            status, rh, stream, _ = await out.client.request(
                method, path, target, hdrs, body.iter_chunks()
            )
        except BaseException as exc:
            self._done_relaying(sender)
            if isinstance(exc, NetError | h2.exceptions.H2Error):  # (the target's stream cap)
                why = f"{target}: {exc}"
                return HandlerResponse(502, ((RELAY_ERROR, why),), why.encode())
            raise
        return HandlerResponse(status, rh, _Relayed(stream, lambda: self._done_relaying(sender)))

    def _done_relaying(self, sender: str) -> None:
        self._relaying[sender] -= 1
        if self._relaying[sender] <= 0:
            del self._relaying[sender]

    def forward_datagram(self, conn: PeerConnection, dst: str, payload: bytes) -> None:
        out = self.t.connection(dst)
        if not self.t.config.relay or out is None or dst not in self._clients:
            self.t.stats.drop("unreachable")
            return
        if not self._datagram_allowed(conn.peer_id):
            # (a flood through the relay shares its write buffer to the client with the
            # client's own gossip and probes: dropped past the sender's rate)
            self.t.stats.drop("relay_rate")
            return
        self._shares.touch(dst)
        out.send_routed(FrameType.RELAYED_DGRAM, conn.peer_id, payload)

    def _datagram_allowed(self, sender: str) -> bool:
        """A token bucket per sender: DGRAM_BURST at once, then DGRAM_RATE_PER_S (an honest
        member gossips and probes a few dozen datagrams a second)."""
        now = asyncio.get_running_loop().time()
        tokens, last = self._dgram_tokens.get(sender, (DGRAM_BURST, now))
        tokens = min(DGRAM_BURST, tokens + (now - last) * DGRAM_RATE_PER_S)
        if tokens < 1:
            self._dgram_tokens[sender] = (tokens, now)
            return False
        if len(self._dgram_tokens) > 4096:  # (forget the senders whose bucket is full again)
            full_s = DGRAM_BURST / DGRAM_RATE_PER_S
            self._dgram_tokens = {p: (n, t) for p, (n, t) in self._dgram_tokens.items()
                                  if now - t < full_s}
        self._dgram_tokens[sender] = (tokens - 1, now)
        return True

    async def aclose(self) -> None:
        loops = list(self._loops.values())
        self._loops.clear()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)


class _Relayed:
    """The target's answer, streamed back to the sender. Closing it, read to its end or not
    (a generator never started runs no `finally`), aborts the target's stream and ends the
    sender's count of open relayed requests, once."""

    def __init__(self, stream: BodyStream, done: Callable[[], None]) -> None:
        self._stream, self._done = stream, done
        self._chunks = stream.iter_chunks()
        self._closed = False

    def __aiter__(self) -> _Relayed:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._chunks)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._stream.abort()
            self._done()


async def _read_limited(body: BodyStream, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in body.iter_chunks():
        size += len(chunk)
        if size > limit:
            with contextlib.suppress(Exception):  # (only stops the sender of an oversized body)
                body.abort()
            break
        parts.append(chunk)
    return b"".join(parts)
