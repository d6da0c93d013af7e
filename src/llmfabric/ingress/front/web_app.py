"""The ingress as an aiohttp application: `add_ingress_routes(app, ingress)` mounts the OpenAI
routes (and /openapi.json) on an existing app (the node does this); `build_ingress_app(...)`
is a standalone ingress app that owns its forwarder."""

from __future__ import annotations

import random

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmfabric.ingress.apis.api_routes import EXTRA_POST_PATHS, not_stored
from llmfabric.ingress.apis.openapi import add_openapi_route
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import IngressConfig
from llmfabric.ingress.front.fast_routes import api_path
from llmfabric.ingress.front.host_check import HostGuard
from llmfabric.ingress.front.web_sink import web_response
from llmfabric.ingress.observe.metrics import IngressMetrics, metrics_handler
from llmfabric.ingress.observe.trace_routes import traces_handler
from llmfabric.ingress.protocols import Authenticator, CandidateSource, Forwarder, UsageSink

INGRESS_KEY = web.AppKey("llmfabric_ingress", Ingress)


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


def add_ingress_routes(app: web.Application, ingress: Ingress) -> None:
    """Mount the OpenAI routes on an existing app (the node does this)."""
    app.router.add_post("/v1/chat/completions", ingress.chat_completions)
    app.router.add_post("/v1/completions", ingress.completions)
    app.router.add_post("/v1/embeddings", ingress.embeddings)
    app.router.add_get("/v1/models", ingress.models)
    for path in sorted(EXTRA_POST_PATHS):
        app.router.add_post(path, ingress.api_route)
    app.router.add_route("*", "/v1/responses/{tail:.+}", _not_stored)
    app.router.add_get("/v1/fabric/traces", traces_handler(ingress))
    add_openapi_route(app)


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
