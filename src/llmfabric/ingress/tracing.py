"""Per-request traces of an ingress: spans for auth, queue, each routing decision and
attempt (forward to first byte, stream to end; under forward the node's own time as it
reported it, clamped, telemetry/node_hop.py; an attempt through a relay carries
via=relay), kept in a ring of the last N and optionally handed to an exporter
(telemetry/otlp.py).

The front that owns the client connection starts a trace (`traced`), which puts the
`RequestTrace` in a context variable; the request core marks phases on `current_trace()` and
the forwarders send `downstream_header()` as the next hop's `traceparent`. When the ingress
has no tracer nothing is created and the core pays one context-variable read per request.
New traces are rate-limited (`Tracer.admit`: at most `rate_per_s` per second, the rest run
untraced, as a Jaeger rate-limiting sampler does); a request that brought its own
`traceparent` is always traced (parent-based).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from llmfabric.ingress.errors import Reply
from llmfabric.telemetry.node_hop import NodeHop
from llmfabric.telemetry.tracecontext import (
    TraceParent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
)

TRACE_HEADER = "X-Fabric-Trace"  # the trace id, returned on every traced response
MAX_SPANS = 64  # per trace: a request with many retries keeps its first spans
_perf = time.perf_counter


@dataclass(slots=True)
class Span:
    name: str
    span_id: str
    parent_id: str  # "" for the root span of a trace that started here
    start_s: float  # seconds since the trace started
    end_s: float
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "span_id": self.span_id, "parent_id": self.parent_id,
                "start_ms": round(self.start_s * 1000, 3), "end_ms": round(self.end_s * 1000, 3),
                "attrs": self.attrs}


class RequestTrace:
    """The spans of one request, times relative to its start (monotonic clock)."""

    __slots__ = ("_attempt", "_cursor", "_end", "_fb", "_head", "_t0", "attempts", "attrs",
                 "downstream", "parent", "root_id", "spans", "started_unix", "status",
                 "trace_id")

    def __init__(self, parent: TraceParent | None, now_unix: float) -> None:
        self.parent = parent  # the client's span, when it sent a valid traceparent
        self.trace_id = parent.trace_id if parent is not None else new_trace_id()
        self.root_id = new_span_id()
        self.started_unix = now_unix
        self._t0 = self._cursor = _perf()
        self.spans: list[Span] = []
        self.attrs: dict[str, Any] = {}
        self.downstream = ""  # the traceparent the current attempt sends to its node
        self._attempt: Span | None = None
        self.attempts = 0  # attempts opened: over every model and phase of the request
        self._fb: float | None = None
        self._head: tuple[float, float] | None = None  # (response head at, node's seconds)
        self.status = 0  # set when finished
        self._end: float | None = None

    def _now(self) -> float:
        return _perf() - self._t0

    def _add(self, span: Span) -> None:
        if len(self.spans) < MAX_SPANS:
            self.spans.append(span)

    def phase(self, name: str, **attrs: Any) -> None:
        """A span from the end of the previous phase until now (sequential phases)."""
        now = _perf()
        self._add(Span(name, new_span_id(), self.root_id, self._cursor - self._t0,
                       now - self._t0, attrs))
        self._cursor = now

    def open_attempt(self, node: str, **attrs: Any) -> None:
        """An upstream attempt starts; its `attempt` attr numbers it within the request (0
        first), the trace counting them itself: the request core tries several models in
        turn, and continuations and prefill/decode phases are attempts too."""
        now = self._now()
        span = Span("attempt", new_span_id(), self.root_id, now, now,
                    {"node": node, "attempt": self.attempts, **attrs})
        self.attempts += 1
        self._attempt, self._fb, self._head = span, None, None
        flags = self.parent.flags if self.parent is not None else 1
        self.downstream = f"00-{self.trace_id}-{span.span_id}-{flags:02x}"

    def upstream(self, hop: NodeHop) -> None:
        """The attempt's response head arrived with what it says about the hop past us."""
        a = self._attempt
        if a is None:
            return
        if hop.relay:
            a.attrs.update(via="relay", relay=hop.relay)
        if hop.node_ms is not None:
            self._head = (self._now(), hop.node_ms / 1000)

    def _forward(self, a: Span, end: float) -> None:
        fwd = Span("forward", new_span_id(), a.span_id, a.start_s, end, {})
        self._add(fwd)
        if self._head is None:
            return
        at, node_s = self._head
        # The node's word, clamped: it ends when its head reached us and cannot start
        # before the attempt did (a node cannot stretch or move the waterfall).
        start = max(a.start_s, at - node_s)
        self._add(Span("node", new_span_id(), fwd.span_id, start, at,
                       {"reported_ms": round(node_s * 1000, 3),
                        "clamped": start > at - node_s}))

    def first_byte(self) -> None:
        """The attempt's node answered: the forward phase ends, the stream phase starts."""
        a = self._attempt
        if a is None:
            return
        self._fb = now = self._now()
        self._forward(a, now)

    def close_attempt(self, status: int | None, error: str = "") -> None:
        a = self._attempt
        if a is None:
            return
        a.end_s = now = self._now()
        a.attrs["status"] = status
        if error:
            a.attrs["error"] = error[:300]
        if self._fb is None:
            self._forward(a, now)
        else:
            self._add(Span("stream", new_span_id(), a.span_id, self._fb, now, {}))
        self._add(a)
        self._attempt = None
        self._cursor = _perf()
        self.downstream = ""

    def root(self, status: int) -> Span:
        return Span("ingress.request", self.root_id,
                    self.parent.span_id if self.parent is not None else "", 0.0,
                    self._end if self._end is not None else self._now(),
                    {**self.attrs, "status": status})

    def to_json(self, status: int) -> dict[str, Any]:
        root = self.root(status)
        spans = sorted(self.spans, key=lambda s: s.start_s)
        return {"trace_id": self.trace_id, "started_at": self.started_unix,
                "duration_ms": round(root.end_s * 1000, 3), "status": status,
                "attrs": root.attrs, "spans": [root.to_json()] + [s.to_json() for s in spans]}


_CURRENT: ContextVar[RequestTrace | None] = ContextVar("llmfabric_request_trace",
                                                       default=None)


def current_trace() -> RequestTrace | None:
    return _CURRENT.get()


def downstream_header() -> bytes:
    """The `traceparent` header line (CRLF-terminated) for the current attempt, or b""."""
    tr = _CURRENT.get()
    if tr is None or not tr.downstream:
        return b""
    return b"traceparent: " + tr.downstream.encode() + b"\r\n"


def downstream_pairs() -> tuple[tuple[str, str], ...]:
    """The same as (name, value) pairs for the peer network's requests."""
    tr = _CURRENT.get()
    return (("traceparent", tr.downstream),) if tr is not None and tr.downstream else ()


class TraceExporter(Protocol):
    def submit(self, trace: dict[str, Any]) -> None:
        """Take one finished trace (JSON shape of `RequestTrace.to_json`); never blocks."""


class Tracer:
    """Keeps the last `keep` finished traces; hands each to `exporter` when one is set."""

    def __init__(self, keep: int = 200, exporter: TraceExporter | None = None,
                 wall: Callable[[], float] = time.time, rate_per_s: int = 100,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.exporter = exporter
        self._wall = wall
        self._ring: deque[RequestTrace] = deque(maxlen=max(1, keep))
        self._rate = max(0, rate_per_s)
        self._mono = mono
        self._window_end = 0.0
        self._left = 0
        self._left_sampled = 0
        self.unsampled = 0  # requests run untraced because the rate was used up

    def admit(self, sampled: bool = False) -> bool:
        """Whether a request starts a trace: at most `rate_per_s` in each one-second window,
        and requests whose client sent a valid `traceparent` with the sampled flag up to ten
        times that, at least 100 (any header, garbage or "not sampled" included, once
        bypassed the rate: one client traced 10,000 requests a second and pushed everyone's
        out of the ring)."""
        now = self._mono()
        if now >= self._window_end:
            self._window_end = now + 1.0
            self._left = self._rate
            self._left_sampled = max(10 * self._rate, 100)
        if sampled and self._left_sampled > 0:
            self._left_sampled -= 1
            return True
        if self._left > 0:
            self._left -= 1
            return True
        self.unsampled += 1
        return False

    def begin(self, parent: TraceParent | None) -> RequestTrace:
        return RequestTrace(parent, self._wall())

    def finish(self, trace: RequestTrace, status: int) -> None:
        """Keep the finished trace (turned into JSON only when read or exported)."""
        trace.status = status
        trace._end = trace._now()
        self._ring.append(trace)
        if self.exporter is not None:
            self.exporter.submit(trace.to_json(status))

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest `limit` traces, newest first."""
        out = list(self._ring)[-max(0, limit):] if limit > 0 else []
        out.reverse()
        return [t.to_json(t.status) for t in out]


class HeaderSink(Protocol):
    headers: dict[str, str] | None


async def traced(tracer: Tracer | None, traceparent: str | bytes | None, sink: HeaderSink,
                 call: Callable[[], Awaitable[Reply | None]]) -> Reply | None:
    """Run one request under a new trace (plainly without a tracer): `sink` (a stream's
    response) and the returned Reply carry X-Fabric-Trace; the trace is finished with the
    response's status."""
    parent = parse_traceparent(traceparent) if traceparent else None
    if tracer is None or not tracer.admit(parent is not None and parent.sampled):
        return await call()
    tr = tracer.begin(parent)
    sink.headers = {TRACE_HEADER: tr.trace_id}
    token = _CURRENT.set(tr)
    status = 499  # (the client went away or the request was cancelled)
    try:
        reply = await call()
        status = reply.status if reply is not None else 200
        if reply is not None:
            reply = replace(reply, headers={**(reply.headers or {}), TRACE_HEADER: tr.trace_id})
        return reply
    finally:
        _CURRENT.reset(token)
        tracer.finish(tr, status)
