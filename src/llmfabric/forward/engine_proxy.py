"""Node side: accept a forwarded inference request and proxy it to the local engine, streaming.

The node mounts `add_engine_proxy_routes(app, proxy)`, which serves
`POST /v1/fabric/forward/<path>` for the paths in paths.FORWARDABLE_PATHS; the peer request handler
(requests arriving over the peer network / relays) calls `proxy.open(path, body)` and relays
the returned Upstream's chunks itself. `around` (the node sets stream_usage.py's counter)
wraps each call to the engine: it sees the request and may rewrite the response's stream.
The engine's response is an `HttpUpstream` (over aiohttp's client); a traced request's is a
`TracedUpstream` around it, which exports the node's `node.engine` span when the node has an
OTLP exporter.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import aiohttp
from aiohttp import web
from yarl import URL

from llmfabric.ingress.config import Timeouts
from llmfabric.ingress.errors import UpstreamError, error_response
from llmfabric.ingress.paths import ENGINE_PATHS, FORWARD_PREFIX, FORWARDABLE_PATHS
from llmfabric.ingress.protocols import Upstream, read_chunks_capped
from llmfabric.ingress.tracing import TraceExporter
from llmfabric.telemetry.node_hop import NO_HOP, NODE_TIME_HEADER, NodeHop, node_time_value
from llmfabric.telemetry.otlp import OtlpExporter
from llmfabric.telemetry.tracecontext import (
    HEADER,
    TraceParent,
    new_span_id,
    parse_traceparent,
)

FORWARD_TOKEN_HEADER = "X-Fabric-Forward-Token"
Opener = Callable[[str, bytes], Awaitable[Upstream]]
Around = Callable[[str, bytes, Opener], Awaitable[Upstream]]
_JSON = {"Content-Type": "application/json"}
_perf = time.perf_counter


def engine_headers(tp: TraceParent | None, hop: str) -> dict[str, str]:
    """The engine request's headers: JSON, and the trace context with this node's hop."""
    if tp is None:
        return _JSON
    return {**_JSON, HEADER: tp.child(hop).header()}


class HttpUpstream:
    """The local engine's response to a node's proxied request (an `Upstream` over aiohttp's
    client; the node's only client to its own engine)."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def content_type(self) -> str:
        return self._resp.headers.get("Content-Type", "application/json")

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"reading the response failed: {e!r}") from e

    async def read_capped(self, limit: int) -> bytes:
        try:
            return await read_chunks_capped(self.chunks(), limit)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(f"reading the response failed: {e!r}") from e

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        # Raises aiohttp.ClientError / TimeoutError mid-stream; callers handle both.
        async for data in self._resp.content.iter_any():
            yield data

    def socket_relay(self) -> None:
        return None

    @property
    def hop(self) -> NodeHop:
        return NO_HOP  # (the engine itself: no hop past it)

    async def aclose(self) -> None:
        self._resp.release()


class TracedUpstream:
    """An engine response that reports the node's hop when it is closed (once): the
    provider node's own span of a traced request, `node.engine`, from the forwarded
    request's arrival at the engine proxy to the end of the engine's response, a child of
    the ingress's attempt span (the `traceparent` the node received). Exported only when the
    node has an OTLP exporter (OTEL_* variables, telemetry/otlp.py); the ingress's waterfall
    shows the same time as its `forward` + `stream` phases."""

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


class EngineProxy:
    def __init__(
        self,
        engine_base_url: str,
        *,
        timeouts: Timeouts | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_response_bytes: int = 64 * 1024 * 1024,
        forward_token: str | None = None,
        session: aiohttp.ClientSession | None = None,
        around: Around | None = None,
    ) -> None:
        """`engine_base_url` like "http://127.0.0.1:8000" (without /v1). If `forward_token` is
        set, HTTP callers must send it in X-Fabric-Forward-Token."""
        self._base = engine_base_url.rstrip("/")
        self._t = timeouts or Timeouts()
        self._max_body = max_body_bytes
        # A whole (non-streamed) answer is held before it is sent on: bounded, as at the
        # ingress (a 400 MiB answer took the node to 1.26 GB).
        self._max_response = max_response_bytes
        self._token = forward_token
        self._own = session is None
        self._session = session
        self._around = around
        self._urls = {p: URL(self._base + ENGINE_PATHS.get(p, p)) for p in FORWARDABLE_PATHS}
        # Where this node's `node.engine` spans go (otlp.exporter_from_env); None: nowhere.
        self.exporter: OtlpExporter | None = None

    def session(self) -> aiohttp.ClientSession:
        """The proxy's connection pool to the engine (also for the node's tokenize calls)."""
        return self._get_session()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def open(self, path: str, body: bytes, traceparent: str | bytes | None = None
                   ) -> Upstream:
        """POST to the engine; raises UpstreamError if the engine cannot be reached.
        `traceparent`: the ingress's, as received; a valid one goes on to the engine as the
        parent of this node's hop (a new span id), anything else is dropped. `around` (the
        node's stream usage counter) wraps the call when set."""
        if self._around is not None:
            return await self._around(
                path, body, lambda p, b: self._open(p, b, traceparent))
        return await self._open(path, body, traceparent)

    async def _open(self, path: str, body: bytes, traceparent: str | bytes | None
                    ) -> Upstream:
        url = self._urls.get(path)
        if url is None:
            raise UpstreamError(f"path {path!r} cannot be forwarded to an engine")
        t = self._t
        tp = parse_traceparent(traceparent)
        hop = new_span_id() if tp is not None else ""
        t0, wall = time.perf_counter(), time.time()
        try:
            resp = await self._get_session().post(
                url, data=body, headers=engine_headers(tp, hop),
                timeout=aiohttp.ClientTimeout(total=t.total, sock_connect=t.connect,
                                              sock_read=t.idle),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UpstreamError(f"the local engine at {self._base} is unreachable: {e!r}") from e
        if tp is not None and self.exporter is not None:
            return TracedUpstream(HttpUpstream(resp), self.exporter, tp, hop, path, t0, wall)
        return HttpUpstream(resp)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        if self._token is not None:
            got = request.headers.get(FORWARD_TOKEN_HEADER, "")
            if not hmac.compare_digest(got.encode(), self._token.encode()):
                return error_response(401, "missing or wrong forward token", "invalid_api_key")
        path = request.path[len(FORWARD_PREFIX):]
        if path not in FORWARDABLE_PATHS:
            return error_response(404, f"{path} is not forwarded to engines", "not_found")
        if request.content_length is not None and request.content_length > self._max_body:
            return error_response(400, "request body too large", "request_too_large")
        body = await request.read()
        if len(body) > self._max_body:
            return error_response(400, "request body too large", "request_too_large")
        traceparent = request.headers.get(HEADER)
        try:
            up = await self.open(path, body, traceparent)
        except UpstreamError as e:
            return error_response(502, str(e), "engine_unreachable")
        headers = {"Content-Type": up.content_type}
        if traceparent is not None:  # a traced request: the ingress shows this node's hop
            headers[NODE_TIME_HEADER] = node_time_value(arrived)
        try:
            if not up.content_type.startswith("text/event-stream"):
                data = await up.read_capped(self._max_response)
                return web.Response(body=data, status=up.status, headers=headers)
            headers["Cache-Control"] = "no-cache"
            resp = web.StreamResponse(status=up.status, headers=headers)
            await resp.prepare(request)
            try:
                async for chunk in up.chunks():
                    await resp.write(chunk)
            except (aiohttp.ClientError, TimeoutError):
                # Cut the stream short: the ingress sees a broken stream and reports it.
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
            return resp
        except UpstreamError as e:
            return error_response(502, str(e), "engine_failed")
        finally:
            await up.aclose()

    async def aclose(self) -> None:
        if self.exporter is not None:
            await self.exporter.aclose()
            self.exporter = None
        if self._session is not None and self._own:
            await self._session.close()
        self._session = None


def add_engine_proxy_routes(app: web.Application, proxy: EngineProxy) -> None:
    app.router.add_post(FORWARD_PREFIX + "/v1/{tail:.+}", proxy.handle)
