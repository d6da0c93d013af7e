"""The standalone ingress advertises each backend's context as its engine reports it
(ingress/sources.py `EngineContexts`), not the 4,096-token default: the sim engine's /v1/models
`max_model_len`, llama-server's /props; a backend down or silent keeps the default, said once;
a context stated with --max-context wins."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmfabric.agent.probe import HttpProbe
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.ingress import StaticCandidateSource
from llmfabric.ingress.sources import EngineContexts
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.testing.poll import wait_until

from .test_ingress_support import models_once_up, serve, stop_group, wait_port

DEFAULT = ServedModel("x").max_context


def _cand(model: str, port: int) -> Candidate:
    return Candidate(f"static-{model}", "", "local", f"127.0.0.1:{port}", (),
                     Hardware("H100", 1), ServedModel(model), LoadHints())


class _Engine:
    """An engine answering /v1/models (and /props, when given): counts the asks."""

    def __init__(self, models: list[dict[str, Any]], props: dict[str, Any] | None = None):
        self.models, self.props, self.asked = models, props, 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        if self.props is not None:
            app.router.add_get("/props", self._props)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        self.asked += 1
        return web.json_response({"object": "list", "data": self.models})

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(self.props)


def _contexts(source: StaticCandidateSource) -> dict[str, int]:
    return {c.model.id: c.model.max_context for c in source.all_candidates()}


async def test_contexts_come_from_the_engines(caplog: pytest.LogCaptureFixture) -> None:
    sim = TestServer(SimEngine(SimEngineConfig(models=("m",), max_model_len=12288)).app())
    llama = TestServer(_Engine([{"id": "/models/llama.gguf"}],
                               props={"default_generation_settings": {"n_ctx": 8192}}).app())
    quiet_engine = _Engine([{"id": "q"}])  # (llama-cpp-python: no context anywhere)
    quiet = TestServer(quiet_engine.app())
    for s in (sim, llama, quiet):
        await s.start_server()
    dead = free_port()
    source = StaticCandidateSource([_cand("m", sim.port), _cand("llama", llama.port),
                                    _cand("q", quiet.port), _cand("dead", dead)])
    probe = HttpProbe()
    contexts = EngineContexts(source, probe, timeout_s=2.0)
    try:
        with caplog.at_level(logging.INFO, "llmfabric.ingress.sources"):
            await contexts.ask()
        assert _contexts(source) == {"m": 12288, "llama": 8192, "q": DEFAULT, "dead": DEFAULT}
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 2, warned
        assert any(f"backend q at 127.0.0.1:{quiet.port} does not report its context: "
                   f"advertising the default context of {DEFAULT} tokens" in w for w in warned)
        assert any(f"backend dead at 127.0.0.1:{dead} did not answer" in w for w in warned)
        caplog.clear()
        with caplog.at_level(logging.INFO, "llmfabric.ingress.sources"):
            await contexts.ask(announce=False)  # the refresh: quiet, and the silent one not
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert quiet_engine.asked == 1  # asked again (its /v1/models holds a model lock)
        assert _contexts(source)["m"] == 12288
    finally:
        await probe.aclose()
        for s in (sim, llama, quiet):
            await s.close()


async def test_an_engine_started_later_is_asked_again() -> None:
    port = free_port()
    source = StaticCandidateSource([_cand("m", port)])
    probe = HttpProbe()
    contexts = EngineContexts(source, probe, timeout_s=2.0)
    runner = None
    try:
        await contexts.ask(announce=False)
        assert _contexts(source) == {"m": DEFAULT}
        contexts.start(period_s=0.05)
        engine = SimEngine(SimEngineConfig(models=("m",), max_model_len=2048))
        runner = await serve(engine.app(), port)
        await wait_until(lambda: _contexts(source) == {"m": 2048}, 10.0, "the new context")
    finally:
        await contexts.aclose()
        await probe.aclose()
        if runner is not None:
            await runner.cleanup()


async def test_cli_ingress_advertises_the_sim_engines_context(tmp_path: Path) -> None:
    eport, iport, dead = free_port(), free_port(), free_port()
    run = [sys.executable, "-c", "from llmfabric.cli.main import main; main()"]
    elog, ilog = (tmp_path / "engine.log").open("wb"), (tmp_path / "ingress.log").open("wb")
    engine = subprocess.Popen(  # noqa: ASYNC220 (starting is quick; we never block on it)
        [*run, "engine", "sim", "--model", "m", "--port", str(eport), "--max-model-len",
         "12288"], stdout=elog, stderr=subprocess.STDOUT, start_new_session=True)
    ingress = None
    try:
        wait_port(eport, 30.0)
        ingress = subprocess.Popen(  # noqa: ASYNC220
            [*run, "ingress", "--port", str(iport), "--no-auth", "--backend",
             f"m=127.0.0.1:{eport}", "--backend", f"dead=127.0.0.1:{dead}",
             # (the same engine under another name, its context stated: the flag wins)
             "--backend", f"q=127.0.0.1:{eport}", "--max-context", "q=4000"],
            stdout=ilog, stderr=subprocess.STDOUT, start_new_session=True)
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1", api_key="x",
                               max_retries=0, timeout=10)
        models = await models_once_up(c, ingress)
        await c.close()
        listed = {m.id: m.model_extra for m in models.data}
        assert listed["m"]["max_context"] == listed["m"]["max_model_len"] == 12288
        assert listed["dead"]["max_context"] == DEFAULT
        assert listed["q"]["max_context"] == 4000
    finally:
        if ingress is not None:
            stop_group(ingress)
        stop_group(engine)
        elog.close()
        ilog.close()
    out = (tmp_path / "ingress.log").read_text()
    assert out.count("did not answer") == 1, out  # said once, for the dead backend
    assert f"backend dead at 127.0.0.1:{dead} did not answer" in out, out
    assert (f"backend q at 127.0.0.1:{eport}: its engine reports a context of 12288 tokens, "
            "its --max-context says 4000: advertising 4000") in out, out
