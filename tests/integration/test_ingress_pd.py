"""The ingress's two-phase path in one process (ingress/pd_path.py): simulated engines with
roles behind the real ingress app; failing prefill nodes are retried, a client error from
the prefill passes through, no working prefill node falls back to colocated serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.engines.pd_role import KVLink
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.forward import HttpForwarder
from llmfabric.front.web_app import build_ingress_app
from llmfabric.ingress import IngressConfig, StaticCandidateSource
from llmfabric.registry.records import Hardware, LoadHints, ModelRole, ServedModel
from llmfabric.routing.candidates import Candidate

MODEL = "llama-3.1-8b"
MSG = [{"role": "user", "content": "two phases please"}]
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def fabric() -> AsyncIterator[tuple[Client, dict[str, SimEngine], dict[str, Client]]]:
    engines: dict[str, SimEngine] = {}
    direct: dict[str, Client] = {}
    cands = []
    for name, role in (("p1", "prefill"), ("p2", "prefill"), ("d1", "decode")):
        eng = SimEngine(SimEngineConfig(models=(MODEL,), role=role, speed=100.0, kv_bits=4,
                                        kv_link=KVLink(400.0, 0.0)))
        c: Client = TestClient(TestServer(eng.app()))
        await c.start_server()
        engines[name], direct[name] = eng, c
        cands.append(Candidate(name, "", "p", f"127.0.0.1:{c.port}", (), Hardware("A40", 1),
                               ServedModel(MODEL, role=ModelRole(role)), LoadHints()))
    app = build_ingress_app(IngressConfig(auth_enabled=False), StaticCandidateSource(cands),
                            HttpForwarder())
    ingress: Client = TestClient(TestServer(app))
    await ingress.start_server()
    yield ingress, engines, direct
    await ingress.close()
    for c in direct.values():
        await c.close()


async def _chat(ingress: Client, **extra: Any) -> tuple[int, Any]:
    r = await ingress.post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 5, "ignore_eos": True, **extra})
    return r.status, await r.json()


async def test_a_failing_prefill_node_is_retried_and_the_answer_is_the_colocated_one(
    fabric: tuple[Client, dict[str, SimEngine], dict[str, Client]],
) -> None:
    ingress, engines, direct = fabric
    await direct["p1"].post("/sim/control", json={"action": "fail", "status": 500})
    for _ in range(6):
        status, body = await _chat(ingress)
        assert status == 200 and body["usage"]["completion_tokens"] == 5
    assert engines["p1"].pd.prefills == 0 and engines["p2"].pd.prefills == 6
    assert engines["d1"].pd.decodes == 6
    plain = await (await direct["d1"].post("/v1/chat/completions", json={
        "model": MODEL, "messages": MSG, "max_tokens": 5, "ignore_eos": True})).json()
    assert body["choices"][0]["message"]["content"] == \
        plain["choices"][0]["message"]["content"]


async def test_client_errors_pass_through_and_no_prefill_node_means_colocated(
    fabric: tuple[Client, dict[str, SimEngine], dict[str, Client]],
) -> None:
    ingress, engines, direct = fabric
    status, body = await _chat(ingress, max_tokens=10**7)  # beyond the context: the engine's 400
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    for name in ("p1", "p2"):
        await direct[name].post("/sim/control", json={"action": "fail", "status": 503})
    status, body = await _chat(ingress)
    assert status == 200  # served whole by the decode node (every role serves plain calls)
    assert engines["d1"].pd.decodes == 0 and engines["d1"].completed == 1


async def test_a_poisoned_kv_handle_falls_back_to_colocated_serving() -> None:
    """A hostile prefill node answers with a handle the decode node refuses (4xx): the client
    got that 400 for every request the node prefilled. Now the colocated path serves it."""
    import aiohttp
    import orjson

    prefill = SimEngine(SimEngineConfig(models=(MODEL,), role="prefill", speed=100.0))
    decode = SimEngine(SimEngineConfig(models=(MODEL,), role="decode", speed=100.0))
    real: Client = TestClient(TestServer(prefill.app()))
    dec: Client = TestClient(TestServer(decode.app()))
    await real.start_server()
    await dec.start_server()

    async def poisoning(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{real.port}{request.path}", data=await request.read(),
                headers={"content-type": "application/json"}) as r:
            doc = await r.json()
        doc["kv_transfer_params"]["kv_tokens"] = 0
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    proxy_app = web.Application()
    proxy_app.router.add_post("/v1/chat/completions", poisoning)
    proxy: Client = TestClient(TestServer(proxy_app))
    await proxy.start_server()
    cands = [Candidate(name, "", "p", f"127.0.0.1:{port}", (), Hardware("A40", 1),
                       ServedModel(MODEL, role=ModelRole(role)), LoadHints())
             for name, port, role in (("p", proxy.port, "prefill"), ("d", dec.port, "decode"))]
    ingress: Client = TestClient(TestServer(build_ingress_app(
        IngressConfig(auth_enabled=False), StaticCandidateSource(cands), HttpForwarder())))
    await ingress.start_server()
    try:
        for stream in (False, True):
            r = await ingress.post("/v1/chat/completions", json={
                "model": MODEL, "messages": MSG, "max_tokens": 5, "ignore_eos": True,
                "stream": stream})
            assert r.status == 200, await r.text()
            await r.read()
        assert prefill.pd.prefills == 2 and decode.pd.decodes == 0
        assert decode.completed == 2  # served whole, colocated (every role serves plain calls)
    finally:
        for c in (ingress, proxy, real, dec):
            await c.close()
