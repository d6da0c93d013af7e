"""The OpenAPI document describes every route a node with an ingress mounts (so it cannot go
stale silently), and both fronts serve it."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from aiohttp import web

from llmfabric.accounts.db import open_backend
from llmfabric.accounts.http import add_account_routes
from llmfabric.accounts.store import AccountStore
from llmfabric.accounts.tenancy_http import add_tenancy_routes
from llmfabric.apis.openapi import OPENAPI_BODY, OPENAPI_PATH, openapi_document
from llmfabric.dashboard.routes import add_dashboard_routes
from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.front.web_app import build_ingress_app
from llmfabric.ingress import FORWARD_PREFIX, IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.node.serve.http_api import ObservedRecord, add_node_routes

pytestmark = pytest.mark.unit

_CONFIG = IngressConfig(node_id="n", auth_enabled=False)

_METHODS = ("get", "post", "put", "delete", "patch")


class _EmptyReplica:
    session_id = "s"

    def observed(self) -> list[ObservedRecord]:
        return []

    def raw_records(self) -> list[dict[str, Any]]:
        return []


def _template(path: str) -> str:
    """/v1/fabric/keys/{key_id} and /v1/responses/{tail:.+} -> the same shape, {}."""
    return re.sub(r"\{[^}]*\}", "{}", path)


async def _no_links() -> dict[str, object]:
    return {"self": "", "nodes": []}


async def _node_app() -> tuple[web.Application, AccountStore]:
    """The routes a node with an ingress, API keys and the dashboard mounts (daemon.py +
    IngressLink.mount), on the standalone ingress app."""
    app = build_ingress_app(_CONFIG, StaticCandidateSource([]),
                            HttpForwarder(FORWARD_PREFIX), serve_metrics=False)
    add_node_routes(app, _EmptyReplica(), [], links=_no_links)
    store = AccountStore(await open_backend("sqlite://:memory:"))
    add_account_routes(app, store)
    add_tenancy_routes(app, store, None)
    add_dashboard_routes(app)
    return app, store


async def test_every_mounted_route_is_described() -> None:
    app, _ = await _node_app()
    doc = openapi_document()
    described = {_template(p): ops for p, ops in doc["paths"].items()}
    mounted: set[tuple[str, str]] = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path, route
        if route.method == "HEAD":  # aiohttp adds HEAD to every GET
            continue
        mounted.add((route.method, _template(path)))
    missing = []
    for method, path in sorted(mounted):
        ops = described.get(path, {})
        methods = _METHODS if method == "*" else (method.lower(),)
        if not all(m in ops for m in methods if method != "*") or (
                method == "*" and not ops):
            missing.append(f"{method} {path}")
    assert not missing, f"routes missing from openapi.py: {missing}"
    # and nothing described that no one serves
    served = {p for _, p in mounted}
    assert set(described) <= served, set(described) - served


def test_document_shape() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for name in re.findall(r"\{([^}]*)\}", path):
            for op in ops.values():
                assert any(p["name"] == name and p["in"] == "path"
                           for p in op.get("parameters", ())), (path, name)
        for op in ops.values():
            assert op["responses"], path
    # public routes are only the ones that need no key
    public = {p for p, ops in doc["paths"].items()
              if any(op.get("security") == [] for op in ops.values())}
    assert public == {"/healthz", "/metrics", OPENAPI_PATH, "/ui", "/ui/", "/ui/{path}"}
    assert orjson.loads(OPENAPI_BODY) == doc


def test_lean_front_routes_it() -> None:
    front = FastFront(Ingress(_CONFIG, StaticCandidateSource([]),
                              HttpForwarder(FORWARD_PREFIX)))

    class Req:
        url = b"/openapi.json?x=1"
        method = b"GET"

    reply = front.route(Req())  # type: ignore[arg-type]
    assert not isinstance(reply, tuple) and reply is not None
    assert reply.status == 200 and orjson.loads(reply.body) == openapi_document()
    Req.method = b"POST"
    refused = front.route(Req())  # type: ignore[arg-type]
    assert refused is not None and not isinstance(refused, tuple) and refused.status == 405
