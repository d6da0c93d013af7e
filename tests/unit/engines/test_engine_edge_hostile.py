"""The engines' shared HTTP edge (http_edge.py) against abusive clients."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from llmfabric.engines.http_edge import listen
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.node.ports import free_port

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
