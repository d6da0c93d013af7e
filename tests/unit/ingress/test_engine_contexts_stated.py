"""A context the operator states (`llmfabric ingress --max-context MODEL=TOKENS`) is the one
advertised whatever the engine reports (ingress/sources.py `EngineContexts`): for an engine that
reports none, one that is down, and one that reports another, which is logged as a warning."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from llmfabric.agent.probe import ProbeError
from llmfabric.ingress import StaticCandidateSource
from llmfabric.ingress.sources import EngineContexts
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate

pytestmark = pytest.mark.unit

LOGGER = "llmfabric.ingress.sources"
DEFAULT = ServedModel("x").max_context


class _Probe:
    """Engines by port: a context (`max_model_len`), None (says nothing), or down."""

    def __init__(self, engines: dict[str, int | None]) -> None:
        self.engines = engines
        self.asked: list[str] = []

    async def models(self, base_url: str, timeout_s: float) -> list[dict[str, Any]]:
        port = base_url.rsplit(":", 1)[1]
        self.asked.append(port)
        if port not in self.engines:
            raise ProbeError("connection refused")
        context = self.engines[port]
        return [{"id": "m"} if context is None else {"id": "m", "max_model_len": context}]

    async def health(self, base_url: str, timeout_s: float) -> bool:
        return True

    async def get_text(self, base_url: str, path: str, timeout_s: float) -> str | None:
        return None

    async def get_json(self, base_url: str, path: str, timeout_s: float) -> Any:
        return None

    async def aclose(self) -> None:
        pass


def _cand(model: str, port: int) -> Candidate:
    return Candidate(f"static-{model}-{port}", "", "local", f"127.0.0.1:{port}", (),
                     Hardware("H100", 1), ServedModel(model), LoadHints())


def _contexts(source: StaticCandidateSource) -> dict[str, int]:
    return {c.http_addr: c.model.max_context for c in source.all_candidates()}


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_a_stated_context_wins_over_every_engine_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    probe = _Probe({"1": 8192, "2": None, "4": 32768, "5": 8192})  # ("3": down)
    source = StaticCandidateSource([_cand("big", 1), _cand("quiet", 2), _cand("gone", 3),
                                    _cand("same", 4), _cand("free", 5)])
    contexts = EngineContexts(source, probe, stated={"big": 32768, "quiet": 16384,
                                                     "gone": 2048, "same": 32768})
    assert _contexts(source)["127.0.0.1:1"] == DEFAULT  # (the source before the first ask)
    with caplog.at_level(logging.INFO, LOGGER):
        await contexts.ask()
    assert _contexts(source) == {"127.0.0.1:1": 32768, "127.0.0.1:2": 16384,
                                 "127.0.0.1:3": 2048, "127.0.0.1:4": 32768,
                                 "127.0.0.1:5": 8192}  # (one not stated: its engine's)
    warned = _messages(caplog, logging.WARNING)
    assert len(warned) == 2, warned
    assert ("backend big at 127.0.0.1:1: its engine reports a context of 8192 tokens, its "
            "--max-context says 32768: advertising 32768") in warned
    assert any(w.startswith("backend gone at 127.0.0.1:3 did not answer") and
               w.endswith("advertising the --max-context of 2048 tokens") for w in warned)
    info = _messages(caplog, logging.INFO)
    assert ("backend quiet at 127.0.0.1:2 does not report its context: advertising the "
            "--max-context of 16384 tokens") in info  # (expected of such an engine: no warning)
    assert "backend same at 127.0.0.1:4: context 32768 tokens (its engine's)" in info


async def test_the_refresh_warns_again_only_when_the_engine_changes(
        caplog: pytest.LogCaptureFixture) -> None:
    probe = _Probe({"1": 8192})
    source = StaticCandidateSource([_cand("m", 1)])
    contexts = EngineContexts(source, probe, stated={"m": 4000})
    await contexts.ask()
    caplog.clear()
    with caplog.at_level(logging.INFO, LOGGER):
        await contexts.ask(announce=False)  # the same report: quiet
        assert not caplog.records
        probe.engines["1"] = 65536  # (restarted with another --max-model-len)
        await contexts.ask(announce=False)
    [warned] = _messages(caplog, logging.WARNING)
    assert "reports a context of 65536 tokens, its --max-context says 4000" in warned
    assert _contexts(source) == {"127.0.0.1:1": 4000}
    assert probe.asked == ["1", "1", "1"]


async def test_without_stated_contexts_the_engines_report_is_advertised() -> None:
    probe = _Probe({"1": 8192, "2": None})
    source = StaticCandidateSource([_cand("m", 1), _cand("q", 2)])
    await EngineContexts(source, probe).ask()
    assert _contexts(source) == {"127.0.0.1:1": 8192, "127.0.0.1:2": DEFAULT}
