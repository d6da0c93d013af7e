"""The small interfaces the ingress is built against (the node backs them with real parts)."""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from typing import Any, NamedTuple, Protocol

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import Reply, UpstreamError
from llmfabric.ingress.usage import Usage
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.liveness import OnDown, Unwatch
from llmfabric.routing.request import RouteRequest
from llmfabric.telemetry.node_hop import NodeHop


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

    def watch_down(self, cand: Candidate, on_down: OnDown) -> Unwatch | None:
        """Call `on_down(level)` once when the candidate's node becomes more doubtful than
        it is now (routing.liveness: suspected, then gone); returns the unwatch, or None for
        a source with no membership view (a static list: nothing ever fires)."""
        ...


class Principal(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def record_trace(self) -> bool:
        """False: the key's owner opted out of request traces."""
        ...

    @property
    def models(self) -> frozenset[str] | None:
        """The model ids the key may use (their aliases and LoRA adapters too); None: all."""
        ...


def bearer_of(header: str) -> str:
    """The token of an `Authorization: Bearer <token>` value ("" when there is none)."""
    return header[7:].strip() if header[:7].lower() == "bearer " else ""


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Principal | None:
        """The principal for a bearer token, or None (-> 401). Must be fast (cached)."""
        ...

    def cached(self, token: str) -> Principal | None:
        """The principal of a token verified before, without awaiting; None: the ingress
        awaits `authenticate` (an authenticator with no such memo always answers None)."""
        ...

    def check_rate(self, principal: Principal) -> float | None:
        """None if the request may go on; else seconds to wait (-> 429 with Retry-After)."""
        ...

    def expired_at(self, token: str) -> float | None:
        """When the key `token` expired (Unix seconds), if `authenticate` refused it for
        that alone (-> 401 expired_api_key, saying when); None otherwise. Asked only on a
        refusal, after `authenticate`."""
        ...


class UsageSink(Protocol):
    def record(
        self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int,
        estimated: bool = False,
    ) -> None:
        """Count one request's tokens (`estimated`: counted by the ingress because the
        engine reported none); must not block."""
        ...


class Refusal(NamedTuple):
    """A request a `Gate` does not admit: the error answer (the arguments of
    Ingress._refuse after the model)."""

    status: int
    message: str
    code: str
    param: str | None
    headers: dict[str, str]


class PriceHold(Protocol):
    """What a request's spend hold was taken at (llmfabric.tenancy `HeldPrice`): a model
    priced above it may not serve the request."""

    def within(self, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        """The candidates whose model costs no more than the hold (`candidates` itself when
        all do)."""
        ...

    def refusal(self, model: str, candidates: Sequence[Candidate]) -> str:
        """Why a request for `model`, whose `candidates` all cost more, is not served."""
        ...


class CompletionHold(Protocol):
    """What an uncapped request held for its completions (llmfabric.tenancy
    `HeldCompletion`): a replica of a larger context gets it capped."""

    def binds(self, candidate: Candidate) -> bool:
        """Whether `candidate` could generate past the hold (its request is capped)."""
        ...

    def capped(self, doc: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """`doc` with its cap fields set to the hold (and `model`, the engine's name)."""
        ...


class Gate(Protocol):
    """Admission per request: budgets and fair queueing (llmfabric.tenancy `TenancyGate`,
    set with `Ingress.use_gate`). The request path calls `admit_at_once(principal) or await
    admit(...)` after authentication, then `held_price()` / `held_completion()` (what the
    admission held bounds), `used(usage, model)` once the usage is known, and `settle()`
    when the request ends, however it ends. Per-request state is the gate's (the request
    path passes nothing around)."""

    def admit_at_once(self, principal: Principal | None) -> bool:
        """True when nothing is to be reserved nor queued for (no coroutine needed)."""
        ...

    async def admit(self, principal: Principal | None, doc: Mapping[str, Any],
                    path: str = "/v1/chat/completions", fallbacks: Sequence[str] = (),
                    route: RouteRequest | None = None) -> Refusal | None:
        """Reserve the request's worst case and wait for its queue slot; a `Refusal` when it
        may not go on. `fallbacks`: the models it may be served by after `doc["model"]`;
        `route`: its allowlist and QoS constraints."""
        ...

    def held_price(self) -> PriceHold | None:
        """The request's spend hold, on a spend budget (None: no price bound)."""
        ...

    def held_completion(self) -> CompletionHold | None:
        """An uncapped request's completion hold (None: nothing to cap)."""
        ...

    def used(self, usage: Usage | None, model: str = "") -> None:
        """The request's usage (`model`: the id it is billed as)."""
        ...

    def settle(self) -> None:
        """The request ended: its slot released, its reservation settled to what it used."""
        ...


# Hands relayed bytes to the client; False when the client's buffer is full (then await the
# writer's `wait_writable()` before pushing more).
Push = Callable[[bytes], bool]
Writable = Callable[[], Awaitable[None]]
# Relays the rest of a response body from the socket callback into `push` (no task wake-up
# per chunk); raises UpstreamError on a node failure or timeout.
SocketRelay = Callable[[Push, Writable], Awaitable[None]]


class Upstream(Protocol):
    """One response from a candidate. `aclose()` must always be called."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...

    async def read_capped(self, limit: int) -> bytes:
        """The whole body, failing (UpstreamError) past `limit` bytes (`read_chunks_capped`
        for an upstream without a better way)."""
        ...

    def chunks(self) -> AsyncGenerator[bytes, None]: ...

    def socket_relay(self) -> SocketRelay | None:
        """The zero-task relay of the rest of the body (the lean upstream client), or None:
        the core then iterates `chunks()`."""
        ...

    @property
    def hop(self) -> NodeHop:
        """The node's reported time and the relay passed (telemetry/node_hop.py); `NO_HOP` when the
        upstream knows neither (the trace then shows no node span)."""
        ...

    async def aclose(self) -> None: ...


class Forwarder(Protocol):
    @property
    def enforces_timeouts(self) -> bool:
        """True when `open` and the upstream enforce every `Timeouts` phase themselves (the
        core then saves its asyncio.timeout contexts around each attempt)."""
        ...

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

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        """The response head: 200, `content_type`, X-Fabric-Node `node` and X-Fabric-Model
        `model` (the name the request asked for of the model that answers)."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...

    def direct_writer(self) -> DirectWriter | None:
        """A synchronous write path for `SocketRelay` (the lean front), or None."""
        ...


class DirectWriter(Protocol):
    """A sink's synchronous write path: bytes go from the node's socket callback straight
    to the client's transport."""

    def write_now(self, data: bytes) -> bool:
        """Write without waiting; False when the client's buffer is full."""
        ...

    async def wait_writable(self) -> None: ...


BodyReader = Callable[[], Awaitable["bytes | Reply"]]


async def read_chunks_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """A whole body from its chunks, failing (UpstreamError) past `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise UpstreamError(f"the node's response is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)
