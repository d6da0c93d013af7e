"""The engines' shared HTTP edge (http_edge.py) against abusive clients."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from llmfabric.engines.http_edge import listen
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.net.ports import free_port

pytestmark = pytest.mark.hostile

MODEL = "llama-3.1-8b"


async def _active(session: aiohttp.ClientSession, base: str) -> int:
    async with session.get(f"{base}/sim/stats") as r:
        return int((await r.json())["active"][MODEL])


async def test_a_client_gone_before_a_non_streamed_answer_frees_its_sequence() -> None:
    """A non-streamed request whose client hung up ran to its last token: aiohttp does not
    cancel handlers by default, so a client that sent long requests and closed at once kept
    the engine's batch (the torch engine's KV blocks) busy for nobody, at no connection cost."""
    engine = SimEngine(SimEngineConfig(models=(MODEL,)))
    port = free_port()
    runner = await listen(engine.app(), "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            body = orjson.dumps({"model": MODEL, "prompt": "abandon me", "max_tokens": 5000,
                                 "ignore_eos": True})
            task = asyncio.create_task(session.post(f"{base}/v1/completions", data=body,
                                                    headers={"Content-Type":
                                                             "application/json"}))
            for _ in range(100):
                if await _active(session, base) == 1:
                    break
                await asyncio.sleep(0.02)
            assert await _active(session, base) == 1
            task.cancel()  # the client goes away: its connection is closed
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if await _active(session, base) == 0:
                    break
                await asyncio.sleep(0.02)
            assert await _active(session, base) == 0
    finally:
        await runner.cleanup()
        for b in engine.batchers.values():
            await b.aclose()


async def test_a_deeply_nested_content_part_is_a_400() -> None:
    """A content part's `text` nested 1,000 lists deep (orjson takes 1,024 levels) raised
    RecursionError in str() inside the handler: a 500 with a traceback, which callers retry
    on other nodes."""
    from aiohttp.test_utils import TestClient, TestServer

    engine = SimEngine(SimEngineConfig(models=(MODEL,), speed=200.0))
    client: TestClient[aiohttp.web.Request, aiohttp.web.Application] = TestClient(
        TestServer(engine.app()))
    await client.start_server()
    try:
        deep = b"[" * 1000 + b"]" * 1000
        body = (b'{"model": "' + MODEL.encode() + b'", "max_tokens": 2, "messages": '
                b'[{"role": "user", "content": [{"type": "text", "text": ' + deep + b"}]}]}")
        r = await client.post("/v1/chat/completions", data=body,
                              headers={"Content-Type": "application/json"})
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "invalid_value"
        ok = await client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}]})
        assert ok.status == 200, await ok.text()
    finally:
        await client.close()


async def test_more_items_than_the_context_are_refused_before_validation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MiB of tiny chat messages (some 580,000) were validated one by one before the
    context check: ~2 s of CPU and ~260 MB in pydantic, about as much again in the engine,
    per request. A body with more messages, content parts or token ids than the context
    holds, or more embedding inputs than OpenAI takes (2,048: each became a 384-float list,
    so 2 million one-character inputs in 8 MiB would have taken tens of GB), is refused
    on the parsed JSON."""
    from aiohttp.test_utils import TestClient, TestServer

    from llmfabric.engines import protocol as p

    engine = SimEngine(SimEngineConfig(models=(MODEL,), speed=200.0, max_model_len=64))
    client: TestClient[aiohttp.web.Request, aiohttp.web.Application] = TestClient(
        TestServer(engine.app()))
    await client.start_server()

    def validated(*_: object, **__: object) -> None:
        raise AssertionError("validated")

    try:
        msg = {"role": "user", "content": ""}
        cases = [
            ("/v1/chat/completions", {"messages": [msg] * 65}, "context_length_exceeded",
             "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{}] * 65}]},
             "invalid_value", "messages"),
            ("/v1/completions", {"prompt": [1] * 65}, "context_length_exceeded", "prompt"),
            ("/v1/completions", {"prompt": [[1] * 65]}, "context_length_exceeded", "prompt"),
            ("/v1/embeddings", {"input": ["a"] * 2049}, "invalid_value", "input"),
        ]
        with monkeypatch.context() as m:
            for cls in (p.ChatRequest, p.CompletionRequest, p.EmbeddingRequest):
                m.setattr(cls, "model_validate", validated)
            for path, body, code, param in cases:
                r = await client.post(path, json={"model": MODEL, "max_tokens": 2, **body})
                assert r.status == 400, (path, await r.text())
                err = (await r.json())["error"]
                assert (err["code"], err["param"]) == (code, param)
        for path, body in [("/v1/chat/completions", {"messages": [msg] * 3}),
                           ("/v1/completions", {"prompt": [1] * 8}),
                           ("/v1/embeddings", {"input": ["a"] * 64})]:
            ok = await client.post(path, json={"model": MODEL, "max_tokens": 2, **body})
            assert ok.status == 200, await ok.text()
    finally:
        await client.close()
        for b in engine.batchers.values():
            await b.aclose()
