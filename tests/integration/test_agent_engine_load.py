"""The supervisor reads an engine's own load over real HTTP: vLLM-style /metrics (with the
prefix-cache counters turned into a recent rate), llama-server /slots when /metrics is off,
/props for its context, and --model-id for an engine that lists nothing."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from llmfabric.agent import EngineSupervisor, SupervisorConfig
from llmfabric.agent.engine_metrics import EngineLoad

pytestmark = pytest.mark.integration
IDLE = [sys.executable, "-c", "import time; time.sleep(60)"]


class FakeEngine:
    """A real aiohttp server answering like an engine; `state` changes what it says."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"models": [{"id": "m"}], "hits": 10, "queries": 40,
                                      "metrics": True}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/slots", self.slots)
        app.router.add_get("/props", self.props)
        return app

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": self.state["models"]})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def slots(self, _: web.Request) -> web.Response:
        return web.json_response([{"id": 0, "is_processing": True},
                                  {"id": 1, "is_processing": False}])

    async def props(self, _: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": 3072}})

    async def metrics(self, _: web.Request) -> web.Response:
        if not self.state["metrics"]:
            return web.Response(status=501, text="metrics disabled")
        s = self.state
        return web.Response(text=(
            'vllm:num_requests_running{model_name="m"} 2\n'
            'vllm:num_requests_waiting{model_name="m"} 6\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {s["hits"]}\n'
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {s["queries"]}\n'
            'llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n'
            'llamacpp:kv_cache_usage_ratio 0.25\n'))


@pytest.fixture
async def engine() -> AsyncIterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def sup(tmp_path: pathlib.Path, url: str, kind: str, **kw: Any) -> EngineSupervisor:
    return EngineSupervisor(SupervisorConfig(
        command=IDLE, log_path=tmp_path / "e.log", engine_url=url, engine_kind=kind,
        ready_poll_s=0.05, health_interval_s=30, **kw))


async def test_vllm_metrics_become_engine_load(
        engine: tuple[FakeEngine, str], tmp_path: pathlib.Path) -> None:
    fake, url = engine
    s = sup(tmp_path, url, "vllm")
    info = await s.start()
    try:
        assert info.kind == "vllm" and s.pid is not None
        first = await s.load()
        assert first == EngineLoad(2, 6, 0.5, 0.25, 10.0, 40.0)
        fake.state.update(hits=40, queries=80)  # 30 hits of the last 40 queries
        second = await s.load()
        assert second is not None and second.prefix_hit_rate == 0.75
    finally:
        await s.stop(2.0)


async def test_llama_server_slots_props_and_declared_models(
        engine: tuple[FakeEngine, str], tmp_path: pathlib.Path) -> None:
    fake, url = engine
    fake.state.update(metrics=False, models=[])  # no --metrics; lists no model
    s = sup(tmp_path, url, "llama.cpp", model_ids=("declared",))
    info = await s.start()
    try:
        assert [(m.id, m.max_context) for m in info.models] == [("declared", 3072)]
        assert await s.load() == EngineLoad(running=1)  # from /slots
        fake.state["metrics"] = True
        assert await s.load() == EngineLoad(1, 2, 0.25)
    finally:
        await s.stop(2.0)


async def test_openai_engine_tells_no_load(
        engine: tuple[FakeEngine, str], tmp_path: pathlib.Path) -> None:
    _, url = engine
    s = sup(tmp_path, url, "openai")
    await s.start()
    try:
        assert await s.load() is None
    finally:
        await s.stop(2.0)
