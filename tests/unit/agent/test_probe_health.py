"""The health probe never touches a route that waits for the engine's model."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from llmfabric.agent.probe import HttpProbe


async def test_a_404_on_health_means_up_without_calling_models() -> None:
    """llama-cpp-python has no /health and serves /v1/models under its model lock (a call
    cuts a running stream short, or waits for it): 404 is enough, /v1/models stays alone."""
    calls: list[str] = []

    async def models(request: web.Request) -> web.Response:
        calls.append(request.path)
        await asyncio.sleep(30)  # the model is busy generating
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    server = TestServer(app)
    await server.start_server()
    probe = HttpProbe()
    try:
        base = str(server.make_url("")).rstrip("/")
        assert await probe.health(base, 2.0) is True
        assert calls == []
    finally:
        await probe.aclose()
        await server.close()


async def test_a_server_error_or_no_server_is_unhealthy() -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_get("/health", broken)
    server = TestServer(app)
    await server.start_server()
    probe = HttpProbe()
    try:
        base = str(server.make_url("")).rstrip("/")
        assert await probe.health(base, 2.0) is False
        await server.close()
        assert await probe.health(base, 2.0) is False
    finally:
        await probe.aclose()


async def test_large_answers_are_read_whole_up_to_the_cap() -> None:
    """`content.read(n)` returns what is buffered: a 424 KB vLLM /metrics written at once came
    back cut at 128 KB (load lost, or a counter cut mid-line). Bodies are read whole up to
    MAX_BODY; a larger one (or a 400 MiB /v1/models) is refused without being held."""
    from llmfabric.agent.probe import MAX_BODY, ProbeError

    metrics = "".join(f'vllm:num_requests_running{{i="{i}"}} 1\n' for i in range(12_000))
    huge = b'{"data": [' + b" " * (MAX_BODY + 10) + b"]}"

    async def text(request: web.Request) -> web.Response:
        return web.Response(text=metrics)

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=huge, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", text)
    app.router.add_get("/v1/models", models)
    server = TestServer(app)
    await server.start_server()
    probe = HttpProbe()
    try:
        base = str(server.make_url("")).rstrip("/")
        got = await probe.get_text(base, "/metrics", 5.0)
        assert got == metrics and len(metrics) > 400_000
        try:
            await probe.models(base, 5.0)
            raise AssertionError("a /v1/models answer over the cap was taken")
        except ProbeError as exc:
            assert "over" in str(exc)
    finally:
        await probe.aclose()
        await server.close()
