"""The ingress as an aiohttp application: `add_ingress_routes(app, ingress)` mounts the OpenAI
routes (and /openapi.json) on an existing app (the node does this); `build_ingress_app(...)`
is a standalone ingress app that owns its forwarder."""

from __future__ import annotations

import random

from aiohttp import web

from llmfabric.ingress.apis.api_routes import EXTRA_POST_PATHS, not_stored
from llmfabric.ingress.apis.openapi import add_openapi_route
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import IngressConfig
from llmfabric.ingress.front.web_sink import web_response
from llmfabric.ingress.observe.metrics import IngressMetrics, metrics_handler
from llmfabric.ingress.observe.trace_routes import traces_handler
from llmfabric.ingress.protocols import Authenticator, CandidateSource, Forwarder, UsageSink

INGRESS_KEY = web.AppKey("llmfabric_ingress", Ingress)


async def _not_stored(_: web.Request) -> web.StreamResponse:
    return web_response(not_stored())


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
) -> web.Application:
    """A standalone ingress app. It owns `forwarder` (closed on app cleanup)."""
    ingress = Ingress(config, candidate_source, forwarder, auth, usage_sink, metrics, rng)
    app = web.Application(client_max_size=config.max_body_bytes + 1)
    app[INGRESS_KEY] = ingress
    add_ingress_routes(app, ingress)
    if serve_metrics:
        app.router.add_get("/metrics", metrics_handler(ingress.metrics))

    async def close_forwarder(_: web.Application) -> None:
        await forwarder.aclose()

    app.on_cleanup.append(close_forwarder)
    return app
