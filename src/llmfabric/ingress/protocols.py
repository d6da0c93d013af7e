"""The small interfaces the ingress is built against (the node backs them with real parts)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import Reply, UpstreamError
from llmfabric.routing.candidates import Candidate


class CandidateSource(Protocol):
    """Where candidates come from: the node's live registry replica, or a static list."""

    def candidates(self, model: str) -> Sequence[Candidate]:
        """Routable candidates (SERVING, not suspected) for a model id or alias."""
        ...

    def is_known(self, model: str) -> bool:
        """Whether any non-LEFT node announces the model (404 vs 503 when none is routable)."""
        ...

    def all_candidates(self) -> Sequence[Candidate]:
        """Every routable candidate, for the /v1/models catalog."""
        ...


class Principal(Protocol):
    @property
    def id(self) -> str: ...


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Principal | None:
        """The principal for a bearer token, or None (-> 401). Must be fast (cached)."""
        ...

    def check_rate(self, principal: Principal) -> float | None:
        """None if the request may go on; else seconds to wait (-> 429 with Retry-After)."""
        ...


class UsageSink(Protocol):
    def record(
        self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
        estimated: bool = False,
    ) -> None:
        """Count one request's tokens (`estimated`: counted by the ingress because the
        engine reported none); must not block."""
        ...


class Upstream(Protocol):
    """One response from a candidate. `aclose()` must always be called."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Forwarder(Protocol):
    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> Upstream:
        """POST `body` (JSON) to `path` (e.g. "/v1/chat/completions") on the candidate and
        return once the response headers arrived. Raises UpstreamError if it could not."""
        ...

    async def aclose(self) -> None: ...


class StreamSink(Protocol):
    """Where a committed stream goes (one per request, used at most once).

    `write` raises ConnectionError when the client is gone; the request path then stops.
    """

    async def start(self, content_type: str, node: str) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


BodyReader = Callable[[], Awaitable["bytes | Reply"]]


async def read_capped(up: Upstream, limit: int) -> bytes:
    """The upstream's whole body, failing (UpstreamError) past `limit` bytes."""
    capped = getattr(up, "read_capped", None)
    if capped is not None:
        data: bytes = await capped(limit)
        return data
    parts: list[bytes] = []
    size = 0
    async for chunk in up.chunks():
        size += len(chunk)
        if size > limit:
            raise UpstreamError(f"the node's response is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)
