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
