"""The provider node's own span of a traced request: `node.engine`, from the forwarded
request's arrival at the engine proxy to the end of the engine's response, a child of the
ingress's attempt span (the `traceparent` the node received). Exported only when the node
has an OTLP exporter (OTEL_* variables, telemetry/otlp.py); the ingress's waterfall shows the same
time as its `forward` + `stream` phases.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

from llmfabric.ingress.forward.engine_upstream import HttpUpstream
from llmfabric.ingress.observe.tracing import TraceExporter
from llmfabric.ingress.protocols import read_chunks_capped
from llmfabric.telemetry.node_hop import NodeHop
from llmfabric.telemetry.tracecontext import TraceParent

_perf = time.perf_counter


class TracedUpstream:
    """An engine response that reports the node's hop when it is closed (once)."""

    __slots__ = ("_exporter", "_first", "_hop", "_parent", "_path", "_t0", "_up", "_wall")

    def __init__(self, up: HttpUpstream, exporter: TraceExporter, parent: TraceParent,
                 hop: str, path: str, t0: float, wall: float) -> None:
        self._up = up
        self._exporter: TraceExporter | None = exporter
        self._parent = parent
        self._hop = hop
        self._path = path
        self._t0 = t0
        self._wall = wall
        self._first: float | None = None

    @property
    def status(self) -> int:
        return self._up.status

    @property
    def content_type(self) -> str:
        return self._up.content_type

    async def read(self) -> bytes:
        data = await self._up.read()
        self._first = self._first or _perf() - self._t0
        return data

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        async for data in self._up.chunks():
            if self._first is None:
                self._first = _perf() - self._t0
            yield data

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    def socket_relay(self) -> None:
        return None

    @property
    def hop(self) -> NodeHop:
        return self._up.hop

    async def aclose(self) -> None:
        await self._up.aclose()
        exporter, self._exporter = self._exporter, None
        if exporter is None:
            return
        end_ms = round((_perf() - self._t0) * 1000, 3)
        attrs: dict[str, object] = {"path": self._path, "status": self._up.status}
        if self._first is not None:
            attrs["first_byte_ms"] = round(self._first * 1000, 3)
        exporter.submit({
            "trace_id": self._parent.trace_id, "started_at": self._wall,
            "duration_ms": end_ms, "status": self._up.status, "attrs": attrs,
            "spans": [{"name": "node.engine", "span_id": self._hop,
                       "parent_id": self._parent.span_id, "start_ms": 0.0, "end_ms": end_ms,
                       "attrs": attrs}],
        })
