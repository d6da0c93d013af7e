"""The fleet views of an ingress need an API key; they stay read-only either way."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.node.serve.http_api import FleetAuth, ObservedRecord, add_node_routes

pytestmark = pytest.mark.hostile

FLEET = ("/v1/fabric/self", "/v1/fabric/nodes", "/v1/fabric/models", "/v1/fabric/providers",
         "/v1/fabric/records")


class EmptyReplica:
    session_id = "s"

    def observed(self) -> list[ObservedRecord]:
        return []

    def raw_records(self) -> list[dict[str, Any]]:
        return []


async def _client(auth: FleetAuth | None) -> TestClient[web.Request, web.Application]:
    app = web.Application()
    add_node_routes(app, EmptyReplica(), [], fleet_auth=auth)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_fleet_views_need_a_valid_key_and_stay_read_only() -> None:
    async def auth(token: str | None) -> bool:
        return token == "lf-good"

    client = await _client(auth)
    try:
        for path in FLEET:
            for headers in ({}, {"Authorization": "Bearer lf-bad"}, {"Authorization": "lf-good"}):
                resp = await client.get(path, headers=headers)
                assert resp.status == 401, (path, headers)
                assert resp.headers["WWW-Authenticate"] == "Bearer"
            resp = await client.get(path, headers={"Authorization": "Bearer lf-good"})
            assert resp.status in (200, 503)  # 503: /self before the record is published
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                resp = await client.request(method, path,
                                            headers={"Authorization": "Bearer lf-good"})
                assert resp.status == 405
        assert (await client.get("/healthz")).status == 200  # liveness needs no key
    finally:
        await client.close()


async def test_a_public_catalog_is_an_explicit_choice() -> None:
    client = await _client(None)  # --public-fleet-info, or not an ingress
    try:
        assert (await client.get("/v1/fabric/models")).status == 200
    finally:
        await client.close()


async def test_a_key_with_a_model_allowlist_gets_no_fleet_view() -> None:
    """The fleet views list every model: a key limited to some must not learn the others
    there (docs/accounts.md "Expiry and model allowlists")."""
    from types import SimpleNamespace

    from llmfabric.accounts import AccountStore
    from llmfabric.node.daemon import Node

    store = await AccountStore.open(":memory:", background=False)
    try:
        _, free = await store.create_key("staff", "cs101")
        _, course = await store.create_key("course", "cs101", models=["llama-8b"])
        node = SimpleNamespace(config=SimpleNamespace(ingress=True, auth=True,
                                                      public_fleet_info=False),
                               ingress=SimpleNamespace(store=store))
        valid = Node._fleet_auth(node)  # type: ignore[arg-type]
        assert valid is not None
        assert await valid(free) and not await valid(course)
        assert not await valid(None) and not await valid("lf-nope")
    finally:
        await store.aclose()
