"""Forwarding through the peer network (relays for NATed nodes), and the per-candidate choice.

Implemented against the transport's peer request API:
`await transport.request(peer_id, method, path, headers, body, timeout=...) -> PeerResponse`
with `.status`, `.headers`, `async for chunk in resp.iter_chunks()` and `aclose()`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.forward_http import FORWARD_PREFIX
from llmfabric.ingress.protocols import Forwarder, Upstream
from llmfabric.routing.candidates import Candidate


class PeerResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class PeerRequester(Protocol):
    async def request(
        self,
        peer_id: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the transport's signature)
    ) -> PeerResponse: ...


class PeerUpstream:
    __slots__ = ("_resp",)

    def __init__(self, resp: PeerResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        for k, v in self._resp.headers.items():
            if k.lower() == "content-type":
                return v
        return "application/json"

    async def read(self) -> bytes:
        parts: list[bytes] = []
        try:
            async for chunk in self._resp.iter_chunks():
                parts.append(chunk)
        except (OSError, TimeoutError, ConnectionError) as e:
            raise UpstreamError(f"reading the relayed response failed: {e!r}") from e
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._resp.iter_chunks():
            yield chunk

    async def aclose(self) -> None:
        await self._resp.aclose()


class PeerForwarder:
    """Sends the request to the candidate's peer id over the transport (direct or relayed)."""

    def __init__(self, transport: PeerRequester, path_prefix: str = FORWARD_PREFIX) -> None:
        self._transport = transport
        self._prefix = path_prefix

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> PeerUpstream:
        try:
            resp = await self._transport.request(
                candidate.peer_id,
                "POST",
                self._prefix + path,
                {"content-type": "application/json"},
                body,
                timeout=timeouts.first_byte,
            )
        except UpstreamError:
            raise
        except Exception as e:  # the transport's own errors: unreachable peer, relay down, ...
            raise UpstreamError(f"peer {candidate.peer_id}: {e!r}") from e
        return PeerUpstream(resp)

    async def aclose(self) -> None:
        return None


class ChoosingForwarder:
    """Direct HTTP when the candidate is dialable, the peer network when it sits behind relays."""

    def __init__(self, direct: Forwarder, peer: Forwarder | None) -> None:
        self._direct = direct
        self._peer = peer

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> Upstream:
        if self._peer is not None and (candidate.relays or not candidate.http_addr):
            return await self._peer.open(candidate, path, body, timeouts)
        return await self._direct.open(candidate, path, body, timeouts)

    async def aclose(self) -> None:
        await self._direct.aclose()
        if self._peer is not None:
            await self._peer.aclose()
