"""Forwarding through the peer network (relays for NATed nodes), and the per-candidate choice.

Implemented against the transport's peer request API:
`await transport.request(peer_id, method, path, headers, body, timeout=...) -> PeerResponse`
with `.status`, `.headers`, `async for chunk in resp.iter_chunks()` and `aclose()`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Protocol

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamConnectError, UpstreamError
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.protocols import Forwarder, Upstream, read_chunks_capped
from llmfabric.ingress.tracing import downstream_pairs
from llmfabric.net.errors import NetError
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NodeHop, parse_node_time

_JSON_HEADERS = (("content-type", "application/json"),)


class PeerResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[str, str]]: ...

    @property
    def via(self) -> str | None:
        """The relay's peer id when the response came through one (None: direct)."""
        ...

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class PeerRequester(Protocol):
    async def request(
        self,
        peer_id: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        timeout: float = ...,  # noqa: ASYNC109 (the transport's signature)
    ) -> PeerResponse: ...


class PeerUpstream:
    """A relayed response: each wait for a chunk ends at `idle` seconds or at the attempt's
    `deadline` (loop time), whichever is first."""

    __slots__ = ("_deadline", "_idle", "_resp")

    def __init__(self, resp: PeerResponse, idle: float, deadline: float | None = None) -> None:
        self._resp = resp
        self._idle = idle
        self._deadline = deadline

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        for k, v in self._resp.headers:
            if k.lower() == "content-type":
                return v
        return "application/json"

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    def socket_relay(self) -> None:
        return None

    @property
    def hop(self) -> NodeHop:
        return peer_hop(self._resp)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        it = self._resp.iter_chunks().__aiter__()
        while True:
            until = asyncio.get_running_loop().time() + self._idle
            if self._deadline is not None:
                until = min(until, self._deadline)
            try:
                async with asyncio.timeout_at(until):
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise
            except NetError as e:  # the transport's own errors (stream reset, relay gone)
                raise UpstreamError(f"the relayed response broke off: {e!r}") from e
            yield chunk

    async def aclose(self) -> None:
        await self._resp.aclose()


def peer_hop(resp: PeerResponse) -> NodeHop:
    """The node's reported time and the relay a peer-network response came through."""
    raw = next((v for k, v in resp.headers if k.lower() == "x-fabric-node-time"), None)
    return NodeHop(parse_node_time(raw), resp.via or "")


class PeerForwarder:
    """Sends the request to the candidate's peer id over the transport (direct or relayed)."""

    enforces_timeouts = False  # (the core bounds each attempt)

    def __init__(self, transport: PeerRequester, path_prefix: str = FORWARD_PREFIX) -> None:
        self._transport = transport
        self._prefix = path_prefix

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> PeerUpstream:
        deadline = asyncio.get_running_loop().time() + timeouts.total
        try:
            resp = await self._transport.request(
                candidate.peer_id,
                "POST",
                self._prefix + path,
                _JSON_HEADERS + downstream_pairs(),
                body,
                timeout=min(timeouts.first_byte, timeouts.total),
            )
        except NetError as e:  # unreachable peer, relay down, ... (a bug is no retryable 502)
            raise UpstreamError(f"peer {candidate.peer_id}: {e!r}") from e
        return PeerUpstream(resp, timeouts.idle, deadline)

    async def aclose(self) -> None:
        return None


def _rest_of(timeouts: Timeouts, elapsed: float) -> Timeouts:
    """The budget left to the peer-path fallback after `elapsed` seconds on the direct path:
    the response must still begin within connect + first_byte of the attempt's start, and
    the attempt end within `total` (a fallback is the same attempt, not a new one)."""
    head = max(timeouts.connect + timeouts.first_byte - elapsed, 0.001)
    return Timeouts(connect=min(timeouts.connect, head), first_byte=head, idle=timeouts.idle,
                    total=max(timeouts.total - elapsed, 0.001))


class ChoosingForwarder:
    """Direct HTTP when the candidate is dialable, the peer network when it sits behind relays.

    A published HTTP address may be unreachable from here (a node that advertises a wrong or
    private address). When the direct connection cannot even be opened (nothing was sent),
    the same request goes through the peer network (authenticated TLS, relays), and that
    address is skipped for `direct_retry_after_s` so later requests do not pay the connect
    timeout again (only when the peer network did answer: when neither path does, the node is
    down or cut off, and after a partition heals its direct address is what works). The
    fallback is part of the same attempt: it gets what is left of connect + first_byte and
    of total, so a node that answers on neither path costs no more than one candidate's
    limits before the ingress tries the next."""

    def __init__(
        self,
        direct: Forwarder,
        peer: Forwarder | None,
        *,
        direct_retry_after_s: float = 30.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._direct = direct
        self._peer = peer
        self._retry_after = direct_retry_after_s
        self._now = now
        self._direct_failed: dict[str, float] = {}  # http_addr -> when to try it again
        self.enforces_timeouts = direct.enforces_timeouts and (
            peer is None or peer.enforces_timeouts)

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> Upstream:
        peer = self._peer
        addr = candidate.http_addr
        if peer is not None and (candidate.relays or not addr):
            return await peer.open(candidate, path, body, timeouts)
        if peer is None or not candidate.peer_id:
            return await self._direct.open(candidate, path, body, timeouts)
        if self._direct_failed:
            until = self._direct_failed.get(addr)
            if until is not None:
                if until > self._now():
                    return await peer.open(candidate, path, body, timeouts)
                del self._direct_failed[addr]
        started = time.monotonic()
        try:
            return await self._direct.open(candidate, path, body, timeouts)
        except UpstreamConnectError as exc:
            rest = _rest_of(timeouts, time.monotonic() - started)
            try:
                up = await peer.open(candidate, path, body, rest)
            except UpstreamError as peer_exc:
                # Neither path answers: the node is down or cut off (a partition), not
                # misadvertised; its direct address is tried first again next time.
                raise UpstreamError(f"direct: {exc}; peer network: {peer_exc}") from peer_exc
            if len(self._direct_failed) > 4096:
                self._direct_failed.clear()
            self._direct_failed[addr] = self._now() + self._retry_after
            return up

    async def aclose(self) -> None:
        await self._direct.aclose()
        if self._peer is not None:
            await self._peer.aclose()
