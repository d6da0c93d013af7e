"""The bench client against a small misbehaving OpenAI-compatible server on loopback: every
failure is classified by kind, and the run's deadline cancels what still hangs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from llmfabric.bench import BenchConfig, RequestSpec, run_load, summarize

from ._sim_engine_proc import free_port

STOP = web.AppKey("stop", asyncio.Event)


async def _completions(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    mode = body["model"]
    if mode == "busy":
        return web.json_response({"error": {"message": "busy"}}, status=503)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(obj: object) -> None:
        await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

    if mode == "ok":
        for i in range(3):
            await send({"choices": [{"index": 0, "text": f"t{i} "}], "usage": None})
        await send({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    elif mode == "broken":
        await resp.write(b"data: {not json\n\n")
    elif mode == "error":
        await send({"error": {"message": "engine died"}})
    elif mode == "hang":
        await send({"choices": [{"index": 0, "text": "first"}]})
        # hold the stream open until the test ends (the fixture sets the event)
        await asyncio.wait_for(request.app[STOP].wait(), 30)
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app[STOP] = asyncio.Event()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        app[STOP].set()
        await runner.cleanup()


def _spec(model: str, offset: float = 0.0) -> RequestSpec:
    return RequestSpec(offset, model, "the cat", 2, 3)


async def test_each_failure_kind(server: str) -> None:
    specs = [_spec(m, 0.01 * i) for i, m in enumerate(["ok", "busy", "broken", "error", "empty"])]
    run = await run_load(specs, BenchConfig(server, drain_s=10))
    kinds = [o.error for o in run.outcomes]
    assert kinds == [None, "http_503", "stream", "server_error", "empty"]
    ok = run.outcomes[0]
    assert ok.output_tokens == 3 and ok.prompt_tokens == 5 and len(ok.itls_s) == 2
    result = summarize(run.outcomes, duration_s=run.duration_s)
    assert result["errors_by_kind"] == {"empty": 1, "http_503": 1, "server_error": 1, "stream": 1}
    # what the server said, not only the kind: the OpenAI error body's message
    said = {e["kind"]: e["message"] for e in result["error_samples"]}
    assert said["http_503"] == "busy" and said["server_error"] == "engine died"


async def test_timeout_cancel_and_connection_errors(server: str) -> None:
    run = await run_load([_spec("hang")], BenchConfig(server, request_timeout_s=0.3))
    assert run.outcomes[0].error == "timeout" and run.outcomes[0].ttft_s is not None
    done: list[str | None] = []
    run = await run_load(
        [_spec("hang"), _spec("ok")],
        BenchConfig(server, drain_s=0.5),
        on_done=lambda o: done.append(o.error),
    )
    assert [o.error for o in run.outcomes] == ["cancelled", None]
    assert sorted(done, key=str) == sorted(["cancelled", None], key=str)
    closed = f"http://127.0.0.1:{free_port()}"
    run = await run_load([_spec("ok")], BenchConfig(closed, drain_s=5))
    assert run.outcomes[0].error == "connection"
