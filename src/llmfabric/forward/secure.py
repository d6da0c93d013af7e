"""Forwarding on the encrypted, mutually authenticated data plane (llmfabric.dataplane).

- `DataPlaneSessions`: the ingress's session key per provider peer id, made on first use by
  the signed exchange over the peer network (direct or through a relay) and renewed before
  it expires; concurrent first requests share one exchange.
- `PinnedHttpsForwarder` (direct path): HTTPS to the provider's data-plane listener (the
  host of its published `http_addr`, the port its signed answer named), accepting only the
  certificate of the candidate's node key, each request with its `X-Fabric-Auth`.
- `SealedPeerForwarder` (peer path, relays): the body and the trace context sealed end to
  end, the response read from sealed frames (status and content type inside them), so relays
  carry ciphertext.

A provider that lost our session (it restarted) answers 401 `unknown_session`: the session
is dropped, made again, and the request sent once more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence

import orjson

from llmfabric.dataplane.authz import AUTH_HEADER, AuthzError, authorize
from llmfabric.dataplane.exchange import (
    MAX_MESSAGE,
    SESSION_PATH,
    ExchangeError,
    SessionKey,
    finish,
    offer,
)
from llmfabric.dataplane.sealing import (
    DATA,
    END,
    HEAD,
    TRACE_HEADER,
    FrameOpener,
    seal_body,
    seal_trace,
)
from llmfabric.forward.peer import PeerRequester, PeerResponse, peer_hop
from llmfabric.forward.raw import RawHttpForwarder, RawUpstream
from llmfabric.identity import NodeKey
from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamConnectError, UpstreamError
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.protocols import read_chunks_capped
from llmfabric.ingress.tracing import current_trace
from llmfabric.net.errors import NetError
from llmfabric.routing.candidates import Candidate
from llmfabric.telemetry.node_hop import NodeHop

_MSGPACK = (("content-type", "application/msgpack"),)
_RENEW_BEFORE_S = 300.0
_REFUSAL_BYTES = 64 * 1024  # a 401 body read before the retry; a hostile node's is cut


class DataPlaneSessions:
    def __init__(self, key: NodeKey, transport: PeerRequester, *,
                 now: Callable[[], float] = time.time, max_sessions: int = 4096) -> None:
        self._key = key
        self._transport = transport
        self._now = now
        self._max = max_sessions
        self._sessions: dict[str, SessionKey] = {}
        self._pending: dict[str, asyncio.Future[SessionKey]] = {}
        self.exchanges = 0

    def cached(self, peer_id: str) -> SessionKey | None:
        s = self._sessions.get(peer_id)
        if s is not None and s.expires - (self._now() + s.offset) > _RENEW_BEFORE_S:
            return s
        return None

    def drop(self, peer_id: str, s: SessionKey) -> None:
        if self._sessions.get(peer_id) is s:
            del self._sessions[peer_id]

    async def get(self, peer_id: str, timeout_s: float) -> SessionKey:
        s = self.cached(peer_id)
        if s is not None:
            return s
        fut = self._pending.get(peer_id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._pending[peer_id] = fut
            try:
                s = await self._exchange(peer_id, timeout_s)
            except BaseException as exc:
                # Waiters get the exchange's error, but never the opener's cancellation (its
                # client left, or its node was suspected meanwhile: ingress/attempt.py): not theirs.
                err: BaseException = exc
                if isinstance(exc, asyncio.CancelledError):
                    err = UpstreamError(f"peer {peer_id}: the session exchange ended before "
                                        "an answer (the request that opened it was cancelled)")
                fut.set_exception(err)
                fut.exception()  # (retrieved: waiters, if any, get it too)
                raise
            finally:
                self._pending.pop(peer_id, None)
            fut.set_result(s)
            return s
        return await asyncio.shield(fut)

    async def _exchange(self, peer_id: str, timeout_s: float) -> SessionKey:
        # `timeout_s` bounds the whole exchange, the answer's body included: a connection
        # that goes silent after the head (a partition) must not hold the request.
        sent = offer(self._key, peer_id)
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            resp = await self._transport.request(peer_id, "POST", SESSION_PATH, _MSGPACK,
                                                 sent.message, timeout=timeout_s)
        except NetError as exc:
            raise UpstreamConnectError(f"peer {peer_id}: no data-plane session: {exc!r}") from exc
        try:
            async with asyncio.timeout_at(deadline):
                body = await read_chunks_capped(resp.iter_chunks(), MAX_MESSAGE)
        except TimeoutError:
            raise UpstreamConnectError(
                f"peer {peer_id}: no data-plane session answer within {timeout_s} s") from None
        except NetError as exc:
            raise UpstreamError(f"peer {peer_id}: session exchange broke off: {exc!r}") from exc
        finally:
            await resp.aclose()
        if resp.status != 200:
            raise UpstreamError(f"peer {peer_id} refused a data-plane session "
                                f"({resp.status}: {body[:200]!r})")
        try:
            s = finish(sent, body, self._now())
        except ExchangeError as exc:
            raise UpstreamError(f"peer {peer_id}: bad session answer: {exc}") from exc
        if len(self._sessions) >= self._max:
            self._sessions.clear()
        self._sessions[peer_id] = s
        self.exchanges += 1
        return s


def _session_refused(status: int, data: bytes) -> bool:
    return status == 401 and b"unknown_session" in data


class PinnedHttpsForwarder:
    """Direct path: HTTPS pinned to the candidate's node key, per-request authorization."""

    enforces_timeouts = True

    def __init__(self, sessions: DataPlaneSessions, raw: RawHttpForwarder) -> None:
        self._sessions = sessions
        self._raw = raw
        self._path_prefix = FORWARD_PREFIX.encode()

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> RawUpstream:
        peer = candidate.peer_id
        if not peer:
            raise UpstreamConnectError(f"node {candidate.session_id} has no peer id")
        for attempt in range(2):
            s = self._sessions.cached(peer) or await self._sessions.get(peer, timeouts.connect)
            if not s.https_port or not candidate.http_addr:
                raise UpstreamConnectError(
                    f"node {candidate.session_id} has no data-plane HTTPS listener")
            host = candidate.http_addr.rpartition(":")[0]
            header, _ = authorize(s, self._path_prefix + path.encode(), body, time.time())
            up = await self._raw.open_to(
                f"{host}:{s.https_port}", path, body, timeouts,
                extra=b"X-Fabric-Auth: " + header + b"\r\n", pin=peer)
            if up.status != 401 or attempt:
                return up
            try:  # (a cancel while reading the refusal must still close the connection)
                data = await up.read_capped(_REFUSAL_BYTES)
            finally:
                await up.aclose()
            if not _session_refused(401, data):
                raise UpstreamError(f"node {candidate.session_id} refused the request: "
                                    f"{data[:200]!r}")
            self._sessions.drop(peer, s)  # the provider restarted: make a new session
        raise UpstreamError("unreachable")  # (the loop returns or raises)

    async def aclose(self) -> None:
        await self._raw.aclose()


class SealedUpstream:
    """A response read from sealed frames (see dataplane/sealing.py). Each wait for a frame
    ends at `idle` seconds or at the attempt's `deadline` (loop time), whichever is first."""

    __slots__ = ("_deadline", "_frames", "_idle", "_it", "_opener", "_resp", "content_type",
                 "status")

    def __init__(self, resp: PeerResponse, opener: FrameOpener, idle: float = 120.0,
                 deadline: float | None = None) -> None:
        self._resp = resp
        self._idle = idle
        self._deadline = deadline
        self._opener = opener
        self._it = resp.iter_chunks().__aiter__()
        self._frames: list[tuple[int, bytes]] = []
        self.status = 502
        self.content_type = "application/json"

    async def _frame(self, idle: float) -> tuple[int, bytes]:
        while not self._frames:
            loop = asyncio.get_running_loop()
            until = loop.time() + idle
            if self._deadline is not None and self._deadline < until:
                until = self._deadline
            try:
                async with asyncio.timeout_at(until):
                    chunk = await self._it.__anext__()
            except StopAsyncIteration:
                raise UpstreamError("the sealed response was cut short") from None
            except TimeoutError:
                if self._deadline is not None and until >= self._deadline:
                    raise UpstreamError("the node's answer ran past the attempt's total "
                                        "time limit") from None
                raise UpstreamError(f"the node sent no data for {idle} s") from None
            except NetError as e:
                raise UpstreamError(f"the relayed response broke off: {e!r}") from e
            try:
                self._frames.extend(self._opener.feed(chunk))
            except AuthzError as e:
                raise UpstreamError(f"the sealed response is invalid: {e}") from e
        return self._frames.pop(0)

    async def start(self, idle: float) -> None:
        kind, data = await self._frame(idle)
        if kind != HEAD:
            raise UpstreamError("the sealed response has no head")
        head = orjson.loads(data)
        self.status = int(head["status"])
        self.content_type = str(head["content_type"])

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    def socket_relay(self) -> None:
        return None

    @property
    def hop(self) -> NodeHop:
        return peer_hop(self._resp)  # (outside the seal: timing only, clamped by the trace)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        while True:
            kind, data = await self._frame(self._idle)
            if kind == END:
                return
            if kind == DATA and data:
                yield data

    async def aclose(self) -> None:
        await self._resp.aclose()


class SealedPeerForwarder:
    """Peer path (direct peer connection or relays): sealed end to end. Every `Timeouts`
    phase is enforced here, as on the direct path: the session exchange within `connect`,
    the head frame within `first_byte` of sending, `idle` between frames, and `total` for
    the whole attempt, so a peer connection that went silent (a partition: no FIN, packets
    dropped) fails the attempt in time for the ingress to try the next candidate."""

    enforces_timeouts = False  # (the core bounds each attempt as well)

    def __init__(self, sessions: DataPlaneSessions, transport: PeerRequester) -> None:
        self._sessions = sessions
        self._transport = transport

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> SealedUpstream:
        peer = candidate.peer_id
        full = FORWARD_PREFIX + path
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total

        def left(limit: float) -> float:
            rest = deadline - loop.time()
            if rest <= 0:
                raise UpstreamError(f"peer {peer}: no answer within the attempt's total "
                                    f"time limit ({timeouts.total} s)")
            return min(limit, rest)

        for attempt in range(2):
            s = (self._sessions.cached(peer)
                 or await self._sessions.get(peer, left(timeouts.connect)))
            header, rid = authorize(s, full.encode(), b"", time.time())
            prefix = header[: header.rindex(b".")]
            aad = prefix + b"\n" + full.encode()
            sealed = seal_body(s.key, rid, aad, body)
            # The trace context sealed too (on every request, traced or not): a relay saw
            # each request's trace id in a plain `traceparent` and could link a trace's hops.
            tr = current_trace()
            headers: Sequence[tuple[str, str]] = (
                ("content-type", "application/octet-stream"),
                (AUTH_HEADER.lower(), header.decode()),
                (TRACE_HEADER, seal_trace(s.key, rid, aad, tr.downstream if tr else "")))
            first_by = min(loop.time() + timeouts.first_byte, deadline)
            try:
                resp = await self._transport.request(peer, "POST", full, headers, sealed,
                                                     timeout=left(timeouts.first_byte))
            except NetError as e:
                raise UpstreamError(f"peer {peer}: {e!r}") from e
            if resp.status == 401 and not attempt:
                try:
                    async with asyncio.timeout_at(first_by):
                        data = await read_chunks_capped(resp.iter_chunks(), _REFUSAL_BYTES)
                except TimeoutError:
                    raise UpstreamError(f"peer {peer} sent no answer within "
                                        f"{timeouts.first_byte} s") from None
                except NetError as e:
                    raise UpstreamError(f"peer {peer}: {e!r}") from e
                finally:
                    await resp.aclose()
                if not _session_refused(401, data):
                    raise UpstreamError(f"peer {peer} refused the request: {data[:200]!r}")
                self._sessions.drop(peer, s)
                continue
            up = SealedUpstream(resp, FrameOpener(s.key, rid), timeouts.idle, deadline)
            try:
                await up.start(max(first_by - loop.time(), 0.0))
            except BaseException:
                await up.aclose()
                raise
            return up
        raise UpstreamError(f"peer {peer} refused two fresh data-plane sessions")

    async def aclose(self) -> None:
        return None
