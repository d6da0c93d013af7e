"""GET /v1/fabric/traces?limit=N: the ingress's last N request traces (newest first), for
the dashboard's waterfall. Admin keys only (traces name keys, models and nodes) when the
ingress authenticates; open in the auth-less local demo."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import error_reply
from llmfabric.ingress.front.web_sink import web_response
from llmfabric.ingress.protocols import bearer_of

MAX_LIMIT = 1000


def traces_handler(ingress: Ingress) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
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
        if not raw.isdigit() or not 0 < int(raw) <= MAX_LIMIT:
            return web_response(error_reply(
                400, f"limit must be an integer in 1..{MAX_LIMIT}", "invalid_parameter",
                "limit"))
        tracer = ingress.tracer
        data = tracer.recent(int(raw)) if tracer is not None else []
        body = {"object": "list", "enabled": tracer is not None, "data": data}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    return handler
