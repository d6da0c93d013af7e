"""The node's engine proxy holds a whole (non-streamed) engine answer before sending it on:
bounded like the ingress's (an engine's 400 MiB answer took the node to 1.26 GB)."""

from __future__ import annotations

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.forward.engine_proxy import EngineProxy, add_engine_proxy_routes
from llmfabric.ingress.paths import FORWARD_PREFIX


async def test_an_engine_answer_over_the_cap_is_a_502_not_held() -> None:
    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b'{"x": "' + b"y" * 200_000 + b'"}',
                            content_type="application/json")

    engine_app = web.Application()
    engine_app.router.add_post("/v1/chat/completions", huge)
    engine = TestServer(engine_app)
    await engine.start_server()
    for cap, status in ((100_000, 502), (1_000_000, 200)):
        proxy = EngineProxy(str(engine.make_url("")).rstrip("/"), max_response_bytes=cap)
        app = web.Application()
        add_engine_proxy_routes(app, proxy)
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            r = await client.post(FORWARD_PREFIX + "/v1/chat/completions",
                                  data=orjson.dumps({"model": "m", "messages": []}))
            assert r.status == status, await r.text()
            if status == 502:
                assert (await r.json())["error"]["code"] == "engine_failed"
        finally:
            await client.close()
            await proxy.aclose()
    await engine.close()
