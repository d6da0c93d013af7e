"""The read-only node HTTP surface: /healthz, /metrics and /v1/fabric/* (docs/http-api.md).

Every route here only reads the local replica; none can modify the registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llmfabric.ingress.errors import error_response
from llmfabric.node.serve.views import ObservedRecord, model_views, node_view, provider_views


class ReplicaReader(Protocol):
    @property
    def session_id(self) -> str: ...

    def observed(self) -> list[ObservedRecord]: ...

    def raw_records(self) -> list[dict[str, Any]]: ...


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


# Answers whether the bearer token (None: no Authorization header) may read the fleet views.
FleetAuth = Callable[[str | None], Awaitable[bool]]


def add_node_routes(
    app: web.Application,
    replica: ReplicaReader,
    metrics: list[CollectorRegistry],
    refresh_metrics: Callable[[], None] | None = None,
    local_view: Callable[[], dict[str, Any]] | None = None,
    fleet_auth: FleetAuth | None = None,
    links: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> None:
    """The read-only node API (GET only: any other method gets 405). With `fleet_auth` (an
    ingress with API keys, unless `--public-fleet-info`) the fleet views need a valid key
    (one without a model allowlist: node/daemon.py)."""
    def self_view() -> dict[str, Any] | None:
        for obs in replica.observed():
            if obs.record.session_id == replica.session_id:
                view = node_view(obs)
                if local_view is not None:  # facts only this node has (the engine's pid)
                    view.update(local_view())
                return view
        return None

    async def healthz(_: web.Request) -> web.Response:
        me = self_view()
        state = me["state"] if me else "STARTING"
        return json_response({"status": "ok", "session_id": replica.session_id, "state": state})

    async def get_self(_: web.Request) -> web.Response:
        me = self_view()
        if me is None:
            return error_response(503, "this node has not published its record yet",
                                  "not_published")
        return json_response(me)

    async def nodes(_: web.Request) -> web.Response:
        return json_response({"nodes": [node_view(o) for o in replica.observed()]})

    async def models(_: web.Request) -> web.Response:
        return json_response({"models": model_views(replica.observed())})

    async def providers(_: web.Request) -> web.Response:
        return json_response({"providers": provider_views(replica.observed())})

    async def records(_: web.Request) -> web.Response:
        return json_response({"records": replica.raw_records()})

    async def prometheus(_: web.Request) -> web.Response:
        if refresh_metrics is not None:
            refresh_metrics()
        resp = web.Response(body=b"".join(generate_latest(r) for r in metrics))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    def guarded(handler: Callable[[web.Request], Awaitable[web.Response]]
                ) -> Callable[[web.Request], Awaitable[web.Response]]:
        if fleet_auth is None:
            return handler

        async def check(request: web.Request) -> web.Response:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            ok = scheme.lower() == "bearer" and bool(token.strip())
            if not (ok and await fleet_auth(token.strip())):
                resp = error_response(401, "the fleet views of an ingress need an API key "
                                      "('Authorization: Bearer lf-...') without a model "
                                      "allowlist, unless the operator started it with "
                                      "--public-fleet-info", "invalid_api_key")
                resp.headers["WWW-Authenticate"] = "Bearer"
                return resp
            return await handler(request)

        return check

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/v1/fabric/self", guarded(get_self))
    app.router.add_get("/v1/fabric/nodes", guarded(nodes))
    app.router.add_get("/v1/fabric/models", guarded(models))
    app.router.add_get("/v1/fabric/providers", guarded(providers))
    app.router.add_get("/v1/fabric/records", guarded(records))
    if links is not None:  # the measured link matrix (net/link_service.py)
        async def get_links(_: web.Request) -> web.Response:
            return json_response(await links())

        app.router.add_get("/v1/fabric/links", guarded(get_links))

