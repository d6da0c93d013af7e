"""User-facing text called a server of no known kind "the openai engine" (and "a openai
engine"): `openai` is the kind of any OpenAI-compatible server, not an engine of OpenAI's.
Such text says "an OpenAI-compatible engine"; known kinds keep their names."""

from __future__ import annotations

import pathlib
from typing import Any

import aiohttp
import pytest

from llmfabric.agent.engines import KINDS, engine_phrase
from llmfabric.agent.probe import ProbeError
from llmfabric.agent.supervisor import EngineSupervisor, SupervisorConfig
from llmfabric.agent.tokenize import EngineTokenizer
from llmfabric.registry.records import ModelRole

pytestmark = pytest.mark.unit


def test_the_phrase() -> None:
    assert engine_phrase("openai") == "an OpenAI-compatible engine"
    assert engine_phrase("vllm") == "the vllm engine"


def _no_session() -> aiohttp.ClientSession:
    raise AssertionError("not called")


def test_no_tokenize_route() -> None:
    with pytest.raises(ValueError, match=r"^an OpenAI-compatible engine has no tokenize route$"):
        EngineTokenizer(KINDS["openai"], "http://127.0.0.1:1", _no_session)
    with pytest.raises(ValueError, match=r"^the sglang engine has no tokenize route$"):
        EngineTokenizer(KINDS["sglang"], "http://127.0.0.1:1", _no_session)


@pytest.mark.parametrize(("argv", "says"), [
    (["./my-server", "--port", "9"], "an OpenAI-compatible engine cannot flip roles"),
    (["vllm", "serve", "m"], "the vllm engine cannot flip roles"),
])
async def test_no_role_flips(tmp_path: pathlib.Path, argv: list[str], says: str) -> None:
    sup: Any = EngineSupervisor(SupervisorConfig(argv, tmp_path / "engine.log"))
    with pytest.raises(ProbeError) as raised:
        await sup.set_role(ModelRole.PREFILL)
    assert str(raised.value) == says
