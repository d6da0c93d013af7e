from __future__ import annotations

import pytest

from llmfabric.agent.command import parse_engine_command
from llmfabric.agent.errors import EngineCommandError
from llmfabric.agent.facts import precision_of as quantization_of
from llmfabric.agent.facts import served_models


@pytest.mark.parametrize(
    ("argv", "kind", "url"),
    [
        (["vllm", "serve", "meta-llama/Llama-3.1-8B"], "vllm", "http://127.0.0.1:8000"),
        (["vllm", "serve", "m", "--port", "9001", "--host", "0.0.0.0"], "vllm",
         "http://127.0.0.1:9001"),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--port=8123"], "vllm",
         "http://127.0.0.1:8123"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang",
         "http://127.0.0.1:30000"),
        (["/opt/bin/llama-server", "-m", "x.gguf", "--host", "10.0.0.5"], "llama.cpp",
         "http://10.0.0.5:8080"),
        (["llmfabric", "engine", "sim", "--model", "m", "--port", "7000"], "sim",
         "http://127.0.0.1:7000"),
        (["/usr/bin/python3", "-m", "llmfabric.cli.engine", "sim", "--port", "7001"], "sim",
         "http://127.0.0.1:7001"),
        (["vllm", "serve", "m", "--host", "::1", "--port", "1"], "vllm", "http://[::1]:1"),
    ],
)
def test_kind_and_url(argv: list[str], kind: str, url: str) -> None:
    cmd = parse_engine_command(argv)
    assert (cmd.kind, cmd.base_url) == (kind, url)


def test_explicit_url_wins_and_errors() -> None:
    cmd = parse_engine_command(["./my-server"], "http://127.0.0.1:5000/v1/")
    assert (cmd.kind, cmd.base_url) == ("openai", "http://127.0.0.1:5000")
    with pytest.raises(EngineCommandError, match="--engine-url"):
        parse_engine_command(["./my-server"])
    with pytest.raises(EngineCommandError, match="--engine-url"):
        parse_engine_command(["llmfabric", "engine", "sim", "--model", "m"])
    with pytest.raises(EngineCommandError, match="--process"):
        parse_engine_command([])
    with pytest.raises(EngineCommandError, match="not a number"):
        parse_engine_command(["vllm", "serve", "m", "--port", "abc"])


def test_quantization_and_models() -> None:
    assert quantization_of(["vllm", "serve", "m", "--quantization", "awq"]) == ("awq-int4", 4)
    assert quantization_of(["vllm", "serve", "m", "-q", "fp8"]) == ("fp8", 8)
    # No flag and no readable model config: the engine decides; we do not claim bf16.
    assert quantization_of(["vllm", "serve", "m"]) == ("auto", 16)
    models = served_models([{"id": "a", "max_model_len": 32768}, {"id": "b"}],
                           ["vllm", "serve", "--quantization=gptq"], 4096)
    assert [(m.id, m.max_context, m.quant_bits) for m in models] == [
        ("a", 32768, 4), ("b", 4096, 4)]


def test_a_port_error_names_the_engine_in_words() -> None:
    """A command of no known kind is an OpenAI-compatible server: the error said "the openai
    engine", the name of no engine. A known kind keeps its name."""
    with pytest.raises(EngineCommandError) as raised:
        parse_engine_command(["./my-server"])
    assert str(raised.value).startswith(
        "cannot tell which port the engine listens on: an OpenAI-compatible engine (")
    with pytest.raises(EngineCommandError, match=r": the sim engine \("):
        parse_engine_command(["llmfabric", "engine", "sim", "--model", "m"])


@pytest.mark.parametrize(("argv", "kind", "says"), [
    (["llmfabric", "engine", "sim", "--model", "m"], None,
     "the sim engine (detected from `llmfabric engine sim`) has no default port"),
    (["vllm", "serve", "m"], "torch", "the torch engine (--engine torch) has no default port"),
    (["docker", "run", "--gpus", "all", "org/server:1", "--model", "m", "--x", "1"], None,
     "an OpenAI-compatible engine (no known engine named in `docker run --gpus all "
     "org/server:1 --model m --x ...`; --engine KIND sets one) has no default port"),
])
def test_a_port_error_says_where_the_kind_came_from(argv: list[str], kind: str | None,
                                                    says: str) -> None:
    """Behind a container launcher a user could not tell what the node understood of the
    command: the error names the kind and the words it was detected from (or that none
    named an engine, and how to set one)."""
    with pytest.raises(EngineCommandError) as raised:
        parse_engine_command(argv, None, kind)
    assert f"cannot tell which port the engine listens on: {says}; add --port" in str(
        raised.value)


def test_detected_names_the_deciding_word() -> None:
    from llmfabric.agent.engines import detected

    assert [(k.name, seen) for k, seen in (
        detected(["vllm", "serve", "m"]),
        detected(["docker", "run", "vllm/vllm-openai", "--model", "m"]),
        detected(["apptainer", "exec", "--nv", "img.sif", "python", "-m",
                  "sglang.launch_server"]),
        detected(["./my-server"]))] == [
        ("vllm", "vllm"), ("vllm", "vllm-openai"), ("sglang", "sglang.launch_server"),
        ("openai", "")]
