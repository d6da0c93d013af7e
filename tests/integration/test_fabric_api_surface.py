"""The Responses and Anthropic APIs through real processes: ingress node (both fronts) ->
gossip replica -> routing -> encrypted data plane -> node agent -> simulated engine, driven by
the official openai and anthropic SDKs."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import anthropic
import openai
import pytest

from llmfabric.launch.local import EngineSpec, LocalFabric
from llmfabric.net.ports import free_port

pytestmark = pytest.mark.slow
MODEL = "qwen3-1.7b"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    root: pathlib.Path = tmp_path_factory.mktemp("fabric")
    with LocalFabric(root) as fab:
        api_port = free_port()
        fab.start_ingress("--api-listen", f"127.0.0.1:{api_port}")
        fab.api_port = api_port  # type: ignore[attr-defined]
        fab.add_node(EngineSpec(MODEL, "L40S", provider="uni-b", speed=20))
        fab.wait_serving({MODEL: 1}, timeout=90)
        yield fab


@pytest.fixture(params=["node-app", "fast-front"])
def base(request: pytest.FixtureRequest, fabric: LocalFabric) -> str:
    assert fabric.ingress is not None
    if request.param == "node-app":
        return fabric.ingress.http_url
    return f"http://127.0.0.1:{fabric.api_port}"  # type: ignore[attr-defined]


def test_responses_sync_and_streaming(fabric: LocalFabric, base: str) -> None:
    c = openai.OpenAI(base_url=base + "/v1", api_key=fabric.admin_key(), max_retries=0)
    r = c.responses.create(model=MODEL, input="hello over the fabric", max_output_tokens=6)
    assert r.output_text and r.usage is not None and r.usage.output_tokens == 6
    events = list(c.responses.create(model=MODEL, input="hello over the fabric",
                                     max_output_tokens=6, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text  # deterministic engine, same prompt
    assert events[-1].type == "response.incomplete"  # stopped at max_output_tokens


def test_anthropic_messages_sync_and_streaming(fabric: LocalFabric, base: str) -> None:
    c = anthropic.Anthropic(base_url=base, api_key=fabric.admin_key(), max_retries=0)
    m = c.messages.create(model=MODEL, max_tokens=5, system="terse",
                          messages=[{"role": "user", "content": "hi fabric"}])
    assert m.content[0].type == "text" and m.usage.output_tokens == 5
    with c.messages.stream(model=MODEL, max_tokens=5, system="terse",
                           messages=[{"role": "user", "content": "hi fabric"}]) as s:
        streamed = "".join(s.text_stream)
    assert streamed == m.content[0].text
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="lf-nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
