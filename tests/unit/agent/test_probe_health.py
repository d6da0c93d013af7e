"""The health probe never touches a route that waits for the engine's model."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmfabric.agent.probe import MAX_BODY, HttpProbe, ProbeError

Handler = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def _engine(routes: dict[str, Handler]
                  ) -> AsyncIterator[tuple[HttpProbe, str, TestServer]]:
    """A fake engine answering GET `routes`, and a probe: (probe, base URL, server)."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    server = TestServer(app)
    await server.start_server()
    probe = HttpProbe()
    try:
        yield probe, str(server.make_url("")).rstrip("/"), server
    finally:
        await probe.aclose()
        await server.close()


async def test_a_404_on_health_means_up_without_calling_models() -> None:
    """llama-cpp-python has no /health and serves /v1/models under its model lock (a call
    cuts a running stream short, or waits for it): 404 is enough, /v1/models stays alone."""
    calls: list[str] = []

    async def models(request: web.Request) -> web.Response:
        calls.append(request.path)
        await asyncio.sleep(30)  # the model is busy generating
        return web.json_response({"data": []})

    async with _engine({"/v1/models": models}) as (probe, base, _):
        assert await probe.health(base, 2.0) is True
        assert calls == []


async def test_a_server_error_or_no_server_is_unhealthy() -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500)

    async with _engine({"/health": broken}) as (probe, base, server):
        assert await probe.health(base, 2.0) is False
        await server.close()
        assert await probe.health(base, 2.0) is False


async def test_large_answers_are_read_whole_up_to_the_cap() -> None:
    """`content.read(n)` returns what is buffered: a 424 KB vLLM /metrics written at once came
    back cut at 128 KB (load lost, or a counter cut mid-line). Bodies are read whole up to
    MAX_BODY; a larger one (or a 400 MiB /v1/models) is refused without being held."""
    metrics = "".join(f'vllm:num_requests_running{{i="{i}"}} 1\n' for i in range(12_000))
    huge = b'{"data": [' + b" " * (MAX_BODY + 10) + b"]}"

    async def text(request: web.Request) -> web.Response:
        return web.Response(text=metrics)

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=huge, content_type="application/json")

    async with _engine({"/metrics": text, "/v1/models": models}) as (probe, base, _):
        got = await probe.get_text(base, "/metrics", 5.0)
        assert got == metrics and len(metrics) > 400_000
        with pytest.raises(ProbeError, match="over"):
            await probe.models(base, 5.0)


async def test_an_engine_that_does_not_answer_is_described_in_words() -> None:
    """The ingress's 'backend m at 127.0.0.1:1 did not answer (...)' and the node's readiness
    lines carried ClientConnectorError(ConnectionKey(host=..., is_ssl=False, ...), ...)."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    probe = HttpProbe()
    try:
        with pytest.raises(ProbeError) as info:
            await probe.models(f"http://127.0.0.1:{port}", 5.0)
    finally:
        await probe.aclose()
    assert str(info.value).startswith(f"/v1/models: Cannot connect to host 127.0.0.1:{port}")
    assert "ConnectionKey" not in str(info.value)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"data": []})

    async with _engine({"/v1/models": slow}) as (probe, base, _):
        with pytest.raises(ProbeError, match=r"^/v1/models: no answer in 0.2 s$"):
            await probe.models(base, 0.2)
