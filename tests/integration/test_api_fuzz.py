"""Schemathesis fuzzes every operation of /openapi.json against real servers: the ingress (the
aiohttp app, as a node mounts it, and the lean front) in front of node engine proxies and the
simulated engine, the rest of a node's routes (fleet views, key and usage admin over a real
AccountStore, dashboard), and the Batch API of an ingress with --batch-dir (Files and Batches,
on both fronts, its runner running what the fuzzer creates). Whatever a client sends
(schema-valid or not, with a valid key), no response is a 5xx and the servers stay up.
Bounded (25 examples per operation) and seeded, so CI runs the same examples every time."""

from __future__ import annotations

import os
import pathlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings

from llmfabric.accounts.budgets import BudgetBook, BudgetStore
from llmfabric.accounts.db import open_backend
from llmfabric.accounts.http import add_account_routes
from llmfabric.accounts.store import AccountStore
from llmfabric.accounts.tenancy_http import add_tenancy_routes
from llmfabric.apis.openapi import (
    OPENAPI_BODY,
    OPENAPI_PATH,
    add_openapi_route,
    openapi_document,
)
from llmfabric.batch import BatchLimits, BatchService
from llmfabric.batch.openapi import openapi_document as batch_document
from llmfabric.dashboard.routes import add_dashboard_routes
from llmfabric.forward import RawHttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.front.host_check import HostGuard
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.protocols import Principal
from llmfabric.net.ports import free_port
from llmfabric.node.serve.http_api import ObservedRecord, add_node_routes
from llmfabric.tenancy.accounts_auth import StaticKeys

from ._api_fabric import KEY, NATIVE, SIM, TOOLY, ApiFabric, api_fabric
from .test_ingress_support import LoopThread, record, serve, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

# Per operation; a deeper local hunt: LLMFABRIC_FUZZ_EXAMPLES=500 (CI keeps the default).
EXAMPLES = int(os.environ.get("LLMFABRIC_FUZZ_EXAMPLES", "25"))
# The ingress serves the OpenAI routes, /metrics and /openapi.json; the node mounts the fleet
# views, key admin and dashboard next to them (fuzzed on a second server, `node_api`).
NODE_ROUTES = r"^/(v1/fabric/|ui|healthz)"


def _served_models(node: Any) -> None:
    """Every `model` field may also name a model the fabric serves, so that examples get past
    routing into the engines, the translations and the stream relays."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict) and props.get("model") == {"type": "string"}:
            props["model"] = {"anyOf": [{"enum": [SIM, TOOLY, NATIVE]}, {"type": "string"}]}
        for value in node.values():
            _served_models(value)
    elif isinstance(node, list):
        for value in node:
            _served_models(value)


_DOC = openapi_document()
_served_models(_DOC)


def _seeded(doc: dict[str, Any]) -> Any:
    """The same examples on every run (schemathesis draws its own seed otherwise)."""
    loaded = schemathesis.openapi.from_dict(doc)
    loaded.config.seed = 20261124
    loaded.config.generation.update(deterministic=True, database="none")
    return loaded


BATCH_ROUTES = r"^/v1/(files|batches)"
schema = _seeded(_DOC).exclude(path_regex=NODE_ROUTES)
batch_schema = _seeded(batch_document()).include(path_regex=BATCH_ROUTES)
node_schema = _seeded(openapi_document()).include(path_regex=NODE_ROUTES)
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fabric() -> Iterator[ApiFabric]:
    yield from api_fabric()


@pytest.fixture(params=["aiohttp", "lean"])
def base_url(request: pytest.FixtureRequest, fabric: ApiFabric) -> str:
    """Both fronts: the aiohttp app (a node's routes) and the lean front (llmfabric ingress)."""
    return fabric.aio_url if request.param == "aiohttp" else fabric.fast_url


@schema.parametrize()
@_SETTINGS
def test_no_server_errors(case: schemathesis.Case, base_url: str) -> None:
    resp = case.call(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"},
                     timeout=30)
    assert resp.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {resp.status_code}: {resp.text[:500]}\n"
        f"{case.as_curl_command()}")


def test_ingress_still_serves_after_fuzz(base_url: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with requests.Session() as client:
        doc = client.get(base_url + OPENAPI_PATH, timeout=10)
        assert doc.status_code == 200 and doc.json() == openapi_document()
        models = client.get(base_url + "/v1/models", headers=auth, timeout=10)
        assert models.status_code == 200
        chat = client.post(base_url + "/v1/chat/completions", headers=auth, timeout=10,
                           json={"model": "llama-3.1-8b", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"]


class _Replica:
    """Two served records, as a node's replica reader shows them."""

    session_id = "nSim"

    def __init__(self) -> None:
        self.records = [record("nSim", "uni-a", "127.0.0.1:1", [SIM]),
                        record("nScr", "uni-b", "127.0.0.1:2", [TOOLY, NATIVE])]

    def observed(self) -> list[ObservedRecord]:
        return [ObservedRecord(r, False, time.time(), r.meta.provider_id) for r in self.records]

    def raw_records(self) -> list[dict[str, Any]]:
        return [{"session_id": r.session_id, "record": None, "suspects": []}
                for r in self.records]


@dataclass
class NodeApi:
    url: str
    admin_key: str
    user_key: str  # a limited key of owner alice (the non-admin policy paths)


@pytest.fixture(scope="module")
def node_api() -> Iterator[NodeApi]:
    """The rest of a node's routes: fleet views behind keys, the key and usage admin routes
    over a real AccountStore (SQLite), the dashboard and /openapi.json; fuzzed with an
    admin key (the most powerful caller) and with a limited user's key."""
    lt = LoopThread()
    port = free_port()
    held: dict[str, Any] = {}

    async def start() -> None:
        store = AccountStore(await open_backend("sqlite://:memory:"))
        _, held["key"] = await store.create_key("fuzz", "admin", admin=True)
        _, held["user"] = await store.create_key("fuzz-user", "alice", requests_per_min=600,
                                                 tokens_per_min=100_000)

        async def valid(token: str | None) -> bool:
            return token is not None and await store.authenticate(token) is not None

        app = web.Application()
        async def links() -> dict[str, Any]:
            return {"self": "", "nodes": []}

        add_node_routes(app, _Replica(), [], fleet_auth=valid, links=links)
        add_account_routes(app, store)
        budgets = BudgetStore(store.backend, BudgetBook(time.time))
        await budgets.load()
        add_tenancy_routes(app, store, budgets)
        add_dashboard_routes(app)
        add_openapi_route(app, OPENAPI_BODY)
        # As on an ingress node's HTTP port: the lean front reads each request and hands
        # these routes' connections to the app.
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        assert runner.server is not None
        front = FastFront(Ingress(IngressConfig(auth_enabled=False), StaticCandidateSource([]),
                                  RawHttpForwarder()), serve_metrics=False,
                          fallback=runner.server)
        await front.start("127.0.0.1", port)
        held["store"], held["runner"], held["front"] = store, runner, front

    lt.call(start)
    wait_port(port)
    try:
        yield NodeApi(f"http://127.0.0.1:{port}", held["key"], held["user"])
    finally:
        async def stop() -> None:
            await held["front"].aclose()
            assert held["front"].handed_over > 0
            await held["runner"].cleanup()
            await held["store"].aclose()
        lt.call(stop)
        lt.stop()


@pytest.fixture(params=["admin", "user"])
def node_key(request: pytest.FixtureRequest, node_api: NodeApi) -> str:
    return node_api.admin_key if request.param == "admin" else node_api.user_key


@node_schema.parametrize()
@_SETTINGS
def test_no_server_errors_on_node_routes(case: schemathesis.Case, node_api: NodeApi,
                                         node_key: str) -> None:
    resp = case.call(base_url=node_api.url, headers={"Authorization": f"Bearer {node_key}"},
                     timeout=30)
    assert resp.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {resp.status_code}: {resp.text[:500]}\n"
        f"{case.as_curl_command()}")


def test_node_routes_still_serve_after_fuzz(node_api: NodeApi) -> None:
    auth = {"Authorization": f"Bearer {node_api.admin_key}"}
    with requests.Session() as client:
        nodes = client.get(node_api.url + "/v1/fabric/nodes", headers=auth, timeout=10)
        assert nodes.status_code == 200
        assert {n["session_id"] for n in nodes.json()["nodes"]} == {"nSim", "nScr"}
        keys = client.get(node_api.url + "/v1/fabric/keys", headers=auth, timeout=10)
        assert keys.status_code == 200 and keys.json()["data"]
        assert client.get(node_api.url + "/healthz", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def batch_fronts() -> Iterator[dict[str, str]]:
    """The Batch API (an ingress with --batch-dir) on both fronts, over real stores in a
    temporary directory, runners started: the lean front handing the batch routes to the
    batch app (llmfabric ingress), and that aiohttp app itself (as a node mounts them).
    No node serves a model: each batch line is answered 404 into the error file."""
    lt = LoopThread()
    held: dict[str, Any] = {"services": [], "runners": [], "fronts": []}
    urls: dict[str, str] = {}
    tmp = tempfile.TemporaryDirectory()

    def service(name: str) -> BatchService:
        keys = StaticKeys({KEY: "k1"})

        async def principals(key_id: str) -> Principal | None:
            return await keys.authenticate(KEY) if key_id == "k1" else None

        ingress = Ingress(IngressConfig(max_body_bytes=64 * 1024), StaticCandidateSource([]),
                          RawHttpForwarder(), auth=keys)
        s = BatchService(ingress, pathlib.Path(tmp.name, name), principals=principals,
                         limits=BatchLimits(max_file_bytes=1024 * 1024,
                                            max_line_bytes=64 * 1024))
        held["services"].append(s)
        return s

    async def start() -> None:
        lean, aio = service("lean"), service("aiohttp")
        for s in (lean, aio):
            s.start()
        runner = web.AppRunner(lean.app(HostGuard()), access_log=None, handle_signals=False)
        await runner.setup()
        assert runner.server is not None
        front = FastFront(lean.ingress, hosts=HostGuard(), fallback=runner.server,
                          openapi_body=lean.openapi_body)
        port = await front.start("127.0.0.1", 0)
        held["runners"].append(runner)
        held["fronts"].append(front)
        urls["lean"] = f"http://127.0.0.1:{port}"
        aio_port = free_port()
        held["runners"].append(await serve(aio.app(HostGuard()), aio_port))
        urls["aiohttp"] = f"http://127.0.0.1:{aio_port}"

    lt.call(start)
    try:
        yield urls
    finally:
        async def stop() -> None:
            for f in held["fronts"]:
                await f.aclose()
            for s in held["services"]:
                await s.aclose()
            for r in held["runners"]:
                await r.cleanup()
        lt.call(stop)
        lt.stop()
        tmp.cleanup()


@pytest.fixture(params=["aiohttp", "lean"])
def batch_url(request: pytest.FixtureRequest, batch_fronts: dict[str, str]) -> str:
    return batch_fronts[request.param]


@batch_schema.parametrize()
@_SETTINGS
def test_no_server_errors_on_batch_routes(case: schemathesis.Case, batch_url: str) -> None:
    resp = case.call(base_url=batch_url, headers={"Authorization": f"Bearer {KEY}"},
                     timeout=30)
    assert resp.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {resp.status_code}: {resp.text[:500]}\n"
        f"{case.as_curl_command()}")


def test_batch_routes_still_serve_after_fuzz(batch_url: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    line = (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "m", "messages": []}}\n')
    with requests.Session() as client:
        f = client.post(batch_url + "/v1/files", headers=auth, timeout=10,
                        files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})
        assert f.status_code == 200, f.text
        assert client.get(batch_url + "/v1/batches", headers=auth, timeout=10).status_code == 200
        assert client.delete(batch_url + f"/v1/files/{f.json()['id']}", headers=auth,
                             timeout=10).status_code == 200
