"""The ingress as an aiohttp application: `add_ingress_routes(app, ingress)` mounts the OpenAI
routes (and /openapi.json) on an existing app (the node does this), each an aiohttp handler
over the request core (`Ingress.serve`, or `ApiRoutes` over it: llmfabric.apis) streaming
through a `WebSink`;
`build_ingress_app(...)` is a standalone ingress app that owns its forwarder. Among the routes,
GET /v1/fabric/traces (`traces_handler`, admin keys) reads the ingress's tracer."""

from __future__ import annotations

import random

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmfabric.apis.api_routes import (
    EXTRA_POST_PATHS,
    MESSAGES,
    ApiRoutes,
    anthropic_auth,
    not_stored,
)
from llmfabric.apis.openapi import OPENAPI_BODY, add_openapi_route
from llmfabric.front.fast_routes import api_path
from llmfabric.front.host_check import HostGuard
from llmfabric.front.web_sink import WebSink, web_response
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import IngressConfig
from llmfabric.ingress.errors import Reply, body_too_large, error_reply
from llmfabric.ingress.metrics import IngressMetrics, metrics_handler
from llmfabric.ingress.protocols import (
    Authenticator,
    CandidateSource,
    Forwarder,
    UsageSink,
    bearer_of,
)
from llmfabric.ingress.tracing import traced
from llmfabric.routing.prefix import SESSION_HEADER

INGRESS_KEY = web.AppKey("llmfabric_ingress", Ingress)
MAX_TRACES_LIMIT = 1000  # GET /v1/fabric/traces?limit=N


async def _not_stored(_: web.Request) -> web.StreamResponse:
    return web_response(not_stored())


def host_middleware(hosts: HostGuard, keyed: bool) -> Middleware:
    """An aiohttp middleware refusing what `hosts.refusal` refuses (host_check.py): a Host
    that is none of this server's names, a cross-site state-changing request. `keyed`: the
    app's OpenAI routes need an API key (exempt then)."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        h = request.headers
        refused = hosts.refusal(h.get("Host", ""), request.method, h.get("Origin"),
                                h.get("Sec-Fetch-Site"), keyed and api_path(request.path))
        if refused is not None:
            return web_response(refused)
        return await handler(request)

    return check


async def read_body(request: web.Request, limit: int) -> bytes | Reply:
    """The request's body, or the 400 for one over `limit` bytes (read no further)."""
    cl = request.content_length
    if cl is not None and cl > limit:
        return body_too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for data in request.content.iter_any():
        size += len(data)
        if size > limit:
            return body_too_large(limit)
        parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _sent(sink: WebSink, reply: Reply | None) -> web.StreamResponse:
    """The aiohttp response of a request the core answered (`reply`) or streamed."""
    if reply is None:
        return sink.response if sink.response is not None else web.StreamResponse()
    return web_response(reply)


def _openai_route(ingress: Ingress, path: str, streamable: bool) -> Handler:
    """POST /v1/chat/completions, /v1/completions or /v1/embeddings."""
    async def handler(request: web.Request) -> web.StreamResponse:
        sink = WebSink(request)
        h = request.headers
        reply = await traced(ingress.tracer, h.get("traceparent"), sink, lambda: ingress.serve(
            path, streamable, h.get("Authorization", ""), h.get("X-Fabric-Providers"),
            lambda: read_body(request, ingress.config.max_body_bytes), sink,
            h.get(SESSION_HEADER)))
        return _sent(sink, reply)

    return handler


def _api_route(api: ApiRoutes) -> Handler:
    """The EXTRA_POST_PATHS routes (api_routes.py)."""
    ingress = api.ingress

    async def handler(request: web.Request) -> web.StreamResponse:
        h = request.headers
        auth = h.get("Authorization", "")
        if request.path == MESSAGES:
            auth = anthropic_auth(auth, h.get("x-api-key"))
        sink = WebSink(request)
        reply = await traced(ingress.tracer, h.get("traceparent"), sink, lambda: api.serve(
            request.path, auth, h.get("X-Fabric-Providers"),
            lambda: read_body(request, ingress.config.max_body_bytes), sink,
            h.get(SESSION_HEADER)))
        return _sent(sink, reply)

    return handler


def traces_handler(ingress: Ingress) -> Handler:
    """GET /v1/fabric/traces?limit=N: the ingress's last N request traces (newest first), for
    the dashboard's waterfall. Admin keys only (traces name keys, models and nodes) when the
    ingress authenticates; open in the auth-less local demo."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if ingress.auth is not None:
            token = bearer_of(request.headers.get("Authorization", ""))
            who = await ingress.auth.authenticate(token) if token else None
            if who is None:
                return web_response(error_reply(401, "missing or invalid API key",
                                                "invalid_api_key"))
            if getattr(who, "admin", False) is not True:
                return web_response(error_reply(403, "only an admin key may read traces",
                                                "forbidden"))
        raw = request.query.get("limit", "50")
        if not raw.isdigit() or not 0 < int(raw) <= MAX_TRACES_LIMIT:
            return web_response(error_reply(
                400, f"limit must be an integer in 1..{MAX_TRACES_LIMIT}", "invalid_parameter",
                "limit"))
        tracer = ingress.tracer
        data = tracer.recent(int(raw)) if tracer is not None else []
        body = {"object": "list", "enabled": tracer is not None, "data": data}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    return handler


def add_ingress_routes(app: web.Application, ingress: Ingress,
                       openapi_body: bytes = OPENAPI_BODY) -> None:
    """Mount the OpenAI routes on an existing app (the node does this). `openapi_body`: the
    /openapi.json served (with routes mounted beside, as the Batch API's:
    `BatchService.openapi_body`)."""
    for path, streamable in (("/v1/chat/completions", True), ("/v1/completions", True),
                             ("/v1/embeddings", False)):
        app.router.add_post(path, _openai_route(ingress, path, streamable))

    async def models(request: web.Request) -> web.StreamResponse:
        return web_response(await ingress.models_reply(request.headers.get("Authorization", "")))

    app.router.add_get("/v1/models", models)
    api = _api_route(ApiRoutes(ingress))
    for path in sorted(EXTRA_POST_PATHS):
        app.router.add_post(path, api)
    app.router.add_route("*", "/v1/responses/{tail:.+}", _not_stored)
    app.router.add_get("/v1/fabric/traces", traces_handler(ingress))
    add_openapi_route(app, openapi_body)


def build_ingress_app(
    config: IngressConfig,
    candidate_source: CandidateSource,
    forwarder: Forwarder,
    auth: Authenticator | None = None,
    usage_sink: UsageSink | None = None,
    metrics: IngressMetrics | None = None,
    *,
    serve_metrics: bool = True,
    rng: random.Random | None = None,
    hosts: HostGuard | None = None,
) -> web.Application:
    """A standalone ingress app. It owns `forwarder` (closed on app cleanup). `hosts`: the
    Host names it answers (default: IP addresses, localhost, the machine's name)."""
    ingress = Ingress(config, candidate_source, forwarder, auth, usage_sink, metrics, rng)
    app = web.Application(client_max_size=config.max_body_bytes + 1, middlewares=[
        host_middleware(hosts if hosts is not None else HostGuard(), ingress.auth is not None)])
    app[INGRESS_KEY] = ingress
    add_ingress_routes(app, ingress)
    if serve_metrics:
        app.router.add_get("/metrics", metrics_handler(ingress.metrics))

    async def close_forwarder(_: web.Application) -> None:
        await forwarder.aclose()

    app.on_cleanup.append(close_forwarder)
    return app
