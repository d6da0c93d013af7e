"""Traces across hops on real sockets: a client's traceparent goes ingress -> node
(EngineProxy) -> engine, each hop with its own span; the ingress returns X-Fabric-Trace and
keeps the request's spans for GET /v1/fabric/traces; hostile traceparents start a fresh
trace and never travel on; spans go to an OTLP collector when one is configured."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from llmfabric.accounts.store import AccountStore
from llmfabric.forward import EngineProxy, HttpForwarder, add_engine_proxy_routes
from llmfabric.front.fast_front import FastFront
from llmfabric.front.web_app import INGRESS_KEY, build_ingress_app
from llmfabric.ingress import FORWARD_PREFIX, IngressConfig, StaticCandidateSource
from llmfabric.ingress.app import Ingress
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.telemetry.otlp import OtlpExporter, exporter_from_env
from llmfabric.telemetry.tracecontext import parse_traceparent
from llmfabric.tenancy.accounts_auth import AccountsAuth

from .test_ingress_support import Backend, serve

pytestmark = pytest.mark.integration

CLIENT_TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class HeaderBackend(Backend):
    """The mock engine, remembering each request's traceparent."""

    def __init__(self) -> None:
        super().__init__("engine")
        self.traceparents: list[str | None] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.traceparents.append(request.headers.get("traceparent"))
        return await super().chat(request)


@contextlib.asynccontextmanager
async def chain(auth: AccountsAuth | None = None) -> AsyncIterator[dict[str, Any]]:
    """engine <- node (EngineProxy) <- ingress (aiohttp app and the lean front)."""
    engine = HeaderBackend()
    e_port, n_port, i_port = free_port(), free_port(), free_port()
    runners = [await serve(engine.app(), e_port)]
    node_seen: list[str | None] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        node_seen.append(request.headers.get("traceparent"))
        resp: web.StreamResponse = await handler(request)
        return resp

    node_app = web.Application(middlewares=[record])
    proxy = EngineProxy(f"http://127.0.0.1:{e_port}")
    add_engine_proxy_routes(node_app, proxy)
    runners.append(await serve(node_app, n_port))
    cand = Candidate("node-1", "peer-1", "p", f"127.0.0.1:{n_port}", (), Hardware("H100", 1),
                     ServedModel("m"), LoadHints())
    config = IngressConfig(auth_enabled=auth is not None)
    app = build_ingress_app(config, StaticCandidateSource([cand]), HttpForwarder(FORWARD_PREFIX),
                            auth=auth, usage_sink=auth)
    runners.append(await serve(app, i_port))
    ingress: Ingress = app[INGRESS_KEY]
    front = FastFront(ingress)
    f_port = await front.start("127.0.0.1", 0)
    try:
        yield {"engine": engine, "node_seen": node_seen, "ingress": ingress, "proxy": proxy,
               "urls": [f"http://127.0.0.1:{i_port}", f"http://127.0.0.1:{f_port}"]}
    finally:
        await front.aclose()
        for r in reversed(runners):
            await r.cleanup()
        await proxy.aclose()


async def test_traceparent_crosses_every_hop_on_both_fronts() -> None:
    async with chain() as c, aiohttp.ClientSession() as http:
        for url in c["urls"]:
            for stream in (False, True):
                async with http.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": stream},
                                     headers={"traceparent": CLIENT_TP}) as r:
                    assert r.status == 200
                    await r.read()
                    assert r.headers["X-Fabric-Trace"] == CLIENT_TP[3:35]
        async with http.get(f"{c['urls'][0]}/v1/fabric/traces?limit=10") as r:
            doc = await r.json()
    assert doc["enabled"] is True and len(doc["data"]) == 4
    engine_tps = [parse_traceparent(t) for t in c["engine"].traceparents]
    node_tps = [parse_traceparent(t) for t in c["node_seen"]]
    assert len(engine_tps) == len(node_tps) == 4
    for trace, at_node, at_engine in zip(reversed(doc["data"]), node_tps, engine_tps,
                                         strict=True):
        assert at_node is not None and at_engine is not None
        assert trace["trace_id"] == at_node.trace_id == at_engine.trace_id == CLIENT_TP[3:35]
        spans = trace["spans"]
        root = spans[0]
        assert root["name"] == "ingress.request" and root["parent_id"] == CLIENT_TP[36:52]
        assert root["attrs"]["model"] == "m" and root["attrs"]["status"] == 200
        [attempt] = [s for s in spans if s["name"] == "attempt"]
        assert attempt["attrs"]["node"] == "node-1" and attempt["parent_id"] == root["span_id"]
        # the node's parent is the ingress's attempt; the engine's is the node's own hop
        assert at_node.span_id == attempt["span_id"]
        assert at_engine.span_id not in {at_node.span_id, root["span_id"], CLIENT_TP[36:52]}
        names = [s["name"] for s in spans]
        assert {"auth", "route", "forward"} <= set(names)
        assert ("stream" in names) == bool(root["attrs"]["stream"])
        # The node's hop (X-Fabric-Node-Time) sits under the attempt's forward span,
        # inside it (clamped at the ingress), on both fronts and both kinds of request.
        [forward] = [s for s in spans if s["name"] == "forward"]
        [node] = [s for s in spans if s["name"] == "node"]
        assert node["parent_id"] == forward["span_id"]
        assert forward["start_ms"] <= node["start_ms"] <= node["end_ms"] <= forward["end_ms"]
        assert node["attrs"]["reported_ms"] >= 0 and "via" not in attempt["attrs"]
        for s in spans:
            assert 0 <= s["start_ms"] <= s["end_ms"] <= root["end_ms"] + 0.001


@pytest.mark.parametrize("bad", [
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
    "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    CLIENT_TP.upper(),
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, 00-abc",
    "x" * 6000,
])
async def test_hostile_traceparent_starts_a_fresh_trace_and_never_travels(bad: str) -> None:
    async with chain() as c, aiohttp.ClientSession() as http:
        for url in c["urls"]:
            async with http.post(f"{url}/v1/chat/completions", json=CHAT,
                                 headers={"traceparent": bad}) as r:
                assert r.status == 200, await r.text()
                got = r.headers["X-Fabric-Trace"]
                assert len(got) == 32 and got not in bad
        for sent in c["node_seen"] + c["engine"].traceparents:
            tp = parse_traceparent(sent)
            assert tp is not None and sent not in bad  # ours, freshly made


async def test_a_head_too_large_for_the_lean_front_is_refused_cleanly() -> None:
    async with chain() as c, aiohttp.ClientSession() as http:
        async with http.post(f"{c['urls'][1]}/v1/chat/completions", json=CHAT,
                             headers={"traceparent": "0" * 200_000}) as r:
            assert r.status == 431
        assert c["engine"].traceparents == []


async def test_traces_route_needs_an_admin_key_and_a_sane_limit(tmp_path: Path) -> None:
    store = await AccountStore.open(f"sqlite:///{tmp_path / 'a.db'}", background=False)
    try:
        _, admin = await store.create_key("root", "admin", admin=True)
        _, user = await store.create_key("app", "alice")
        async with chain(AccountsAuth(store)) as c, aiohttp.ClientSession() as http:
            base = c["urls"][0]
            async with http.post(f"{base}/v1/chat/completions", json=CHAT,
                                 headers={"Authorization": f"Bearer {user}"}) as r:
                assert r.status == 200
            for token, status in (("", 401), ("lf-nope-nope", 401), (user, 403), (admin, 200)):
                async with http.get(f"{base}/v1/fabric/traces",
                                    headers={"Authorization": f"Bearer {token}"}) as r:
                    assert r.status == status
                    if status == 200:
                        [t] = (await r.json())["data"]
                        assert next(s for s in t["spans"] if s["name"] == "auth")["attrs"][
                            "key_id"] == user.split("-")[1]
            for limit in ("0", "-1", "abc", "1001", "1" * 400):
                async with http.get(f"{base}/v1/fabric/traces?limit={limit}",
                                    headers={"Authorization": f"Bearer {admin}"}) as r:
                    assert r.status == 400
    finally:
        await store.aclose()


async def test_spans_are_exported_to_an_otlp_collector_and_a_dead_one_costs_nothing() -> None:
    received: list[dict[str, Any]] = []

    async def collect(request: web.Request) -> web.Response:
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["x-tenant"] == "t1"
        received.append(orjson.loads(await request.read()))
        return web.json_response({})

    col = web.Application()
    col.router.add_post("/v1/traces", collect)
    col_port = free_port()
    runner = await serve(col, col_port)
    try:
        exporter = exporter_from_env({
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{col_port}",
            "OTEL_SERVICE_NAME": "edge-1", "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1"})
        assert exporter is not None
        exporter.interval_s = 0.05
        async with chain() as c, aiohttp.ClientSession() as http:
            c["ingress"].tracer.exporter = exporter
            async with http.post(f"{c['urls'][1]}/v1/chat/completions", json=CHAT,
                                 headers={"traceparent": CLIENT_TP}) as r:
                assert r.status == 200
            for _ in range(100):
                if received:
                    break
                await asyncio.sleep(0.05)
            await exporter.aclose()
        [payload] = received
        [rs] = payload["resourceSpans"]
        assert rs["resource"]["attributes"] == [
            {"key": "service.name", "value": {"stringValue": "edge-1"}}]
        spans = rs["scopeSpans"][0]["spans"]
        assert {s["traceId"] for s in spans} == {CLIENT_TP[3:35]}
        root = next(s for s in spans if s["name"] == "ingress.request")
        assert root["parentSpanId"] == CLIENT_TP[36:52] and root["kind"] == 2
        ids = {s["spanId"] for s in spans}
        assert all(s["parentSpanId"] in ids for s in spans if s is not root)
        assert all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) > 0 for s in spans)
        assert exporter.exported == 1 and exporter.dropped == 0
    finally:
        await runner.cleanup()
    # the collector is gone: requests still succeed, the traces are dropped and counted
    dead = OtlpExporter(f"http://127.0.0.1:{col_port}/v1/traces", interval_s=0.05,
                        timeout_s=1.0)
    async with chain() as c, aiohttp.ClientSession() as http:
        c["ingress"].tracer.exporter = dead
        async with http.post(f"{c['urls'][0]}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
        await dead.aclose()
    assert dead.dropped == 1 and dead.exported == 0


def test_export_is_off_by_default() -> None:
    assert exporter_from_env({}) is None
    assert exporter_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
                              "OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ValueError):
        exporter_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "file:///etc/passwd"})
    t = exporter_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4318/custom"})
    assert t is not None and t.url == "https://c:4318/custom"


class Collected:
    """An exporter that keeps what it is given (the node's spans)."""

    def __init__(self) -> None:
        self.traces: list[dict[str, Any]] = []

    def submit(self, trace: dict[str, Any]) -> None:
        self.traces.append(trace)

    async def aclose(self) -> None:
        return None


async def test_the_node_reports_its_own_hop_as_a_child_of_the_attempt() -> None:
    async with chain() as c, aiohttp.ClientSession() as http:
        node_spans = Collected()
        c["proxy"].exporter = node_spans
        for stream in (False, True):
            async with http.post(f"{c['urls'][1]}/v1/chat/completions",
                                 json={**CHAT, "stream": stream},
                                 headers={"traceparent": CLIENT_TP}) as r:
                assert r.status == 200
                await r.read()
        async with http.post(f"{c['urls'][1]}/v1/chat/completions", json=CHAT,
                             headers={"traceparent": "garbage"}) as r:
            assert r.status == 200
        async with http.get(f"{c['urls'][0]}/v1/fabric/traces?limit=3") as r:
            traces = (await r.json())["data"][::-1]
        c["proxy"].exporter = None
    assert len(node_spans.traces) == 3  # the garbage header became a fresh, valid trace
    for ingress_trace, node_trace, at_engine in zip(
            traces, node_spans.traces, c["engine"].traceparents, strict=True):
        [span] = node_trace["spans"]
        [attempt] = [s for s in ingress_trace["spans"] if s["name"] == "attempt"]
        tp = parse_traceparent(at_engine)
        assert tp is not None and node_trace["trace_id"] == ingress_trace["trace_id"]
        assert span["name"] == "node.engine" and span["parent_id"] == attempt["span_id"]
        assert span["span_id"] == tp.span_id  # the engine's parent is the node's hop
        assert span["attrs"]["status"] == 200 and span["attrs"]["first_byte_ms"] >= 0
        assert 0 <= span["attrs"]["first_byte_ms"] <= span["end_ms"]
