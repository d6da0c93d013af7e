"""Ingress configuration (frozen) and the optional trace hook's event type."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmfabric.net.tcp_keepalive import KeepAlive
from llmfabric.routing.policies import DEFAULT_POLICY


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-phase limits in seconds for one attempt on one candidate."""

    connect: float = 5.0  # TCP connect to the candidate
    first_byte: float = 300.0  # request sent -> response headers and first body chunk
    idle: float = 120.0  # between two body chunks of a stream
    total: float = 1800.0  # the whole attempt
    # Dead-peer detection on direct connections (net/tcp_keepalive.py), independent of
    # `idle`: a node that vanished without closing (no FIN/RST) is noticed after
    # keepalive_idle + keepalive_interval * keepalive_count seconds of silence (11 s), and
    # its stream then continues on another node like any stream cut mid-way.
    keepalive_idle: float = 5.0
    keepalive_interval: float = 2.0
    keepalive_count: int = 3

    @property
    def keepalive(self) -> KeepAlive:
        return KeepAlive(self.keepalive_idle, self.keepalive_interval, self.keepalive_count)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One finished request, handed to `IngressConfig.trace_hook` (if set)."""

    path: str
    model: str
    key_id: str | None
    node: str | None  # session id that served (None if none did)
    status: int
    stream: bool
    attempts: int  # upstream attempts, over every model tried (the body's `models`)
    started_at: float  # time.time() at arrival
    ttft_s: float | None  # first response byte (stream) or full response (non-stream)
    e2e_s: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # The parsed request body (for anonymized trace recording; never logged as is).
    request: Mapping[str, Any] | None = None
    opted_out: bool = False  # the caller's key opted out of trace recording


TraceHook = Callable[[TraceEvent], None]


@dataclass(frozen=True, slots=True)
class IngressConfig:
    node_id: str = "ingress"  # this ingress's session id (for logs; X-Fabric-Node names servers)
    policy: str = DEFAULT_POLICY
    max_retries: int = 2  # extra candidates tried after the first fails
    max_body_bytes: int = 8 * 1024 * 1024
    timeouts: Timeouts = field(default_factory=Timeouts)
    auth_enabled: bool = True  # False only for the local demo
    retry_after_s: int = 2  # Retry-After on 503
    # Ask engines for usage on streams whose client did not, and strip that chunk again.
    inject_stream_usage: bool = True
    prefix_chars: int = 512  # prompt prefix length used by prefix_affinity
    # An upstream's non-streamed body larger than this fails the attempt (502); a streamed
    # SSE line longer than `max_sse_line_bytes` is relayed unscanned instead of held.
    max_response_bytes: int = 64 * 1024 * 1024
    max_sse_line_bytes: int = 4 * 1024 * 1024
    trace_hook: TraceHook | None = None
    # Names this ingress's operator pins to one model id (`--model-alias NAME=ID`): a request
    # for NAME goes to replicas of ID only, whatever aliases members list (routing/filters.py
    # `resolve`: otherwise an alias several models list is refused with 409).
    model_aliases: tuple[tuple[str, str], ...] = ()
    # Models whose engines serve POST /v1/responses themselves (vLLM >= 0.10): passed through
    # unchanged; "*" for all. Others get the Responses API translated to chat completions.
    native_responses_models: tuple[str, ...] = ()
    # A chat stream whose node fails after the first byte continues on another node
    # (ingress/continuation.py); a request opts out with metadata.continuation = false.
    continue_streams: bool = True
    # Request traces kept in memory for GET /v1/fabric/traces (the dashboard's waterfall);
    # 0: no tracing at all (no spans, no traceparent sent on).
    keep_traces: int = 200
    # New traces started per second at most (a rate-limiting sampler: a trace costs ~15 us of
    # CPU, a third of a loaded worker's budget per request); requests past it, within the
    # same second, run untraced. A request whose client sent a `traceparent` is always traced.
    trace_rate_per_s: int = 100
