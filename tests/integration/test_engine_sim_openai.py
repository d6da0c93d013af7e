"""The simulated engine as a real subprocess, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import sys
import urllib.request
from collections.abc import Iterator

import aiohttp
import numpy as np
import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _sim_engine_proc import running_engine

from ._sdk_clients import tracked

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, pathlib.Path]]:
    log = tmp_path_factory.mktemp("sim") / "engine.log"
    with running_engine(log) as (base, _):
        yield base, log


@pytest.fixture
def client(engine: tuple[str, pathlib.Path]) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=engine[0] + "/v1", api_key="unused", max_retries=0))


def control(base: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(f"{base}/sim/control", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (models.data[0].model_extra or {})["max_model_len"] >= 4096


def test_chat_non_streaming_and_streaming_agree(client: openai.OpenAI) -> None:
    msgs: list[dict[str, str]] = [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "hello fabric"}]
    full = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=7)  # type: ignore[arg-type]
    assert full.object == "chat.completion"
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 7
    assert full.usage.prompt_tokens > 8  # two messages + template overhead
    stream = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=7, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])


def test_continue_final_message_goes_on_where_the_prefix_stops(client: openai.OpenAI) -> None:
    """vLLM's continue_final_message: the sim engine continues an assistant prefix with the
    text an uninterrupted run gives (what the ingress's stream continuation relies on)."""
    msgs: list[dict[str, str]] = [{"role": "user", "content": "a story"}]
    full = client.chat.completions.create(model=MODEL, messages=msgs)  # type: ignore[arg-type]
    whole = full.choices[0].message.content or ""
    words = whole.split(" ")
    head = " ".join(words[:5])
    rest = client.chat.completions.create(
        model=MODEL, messages=[*msgs, {"role": "assistant", "content": head}],  # type: ignore[list-item]
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert head + (rest.choices[0].message.content or "") == whole
    assert rest.choices[0].finish_reason == full.choices[0].finish_reason == "stop"


def test_prefix_cache_counts_a_repeated_prompt(client: openai.OpenAI,
                                               engine: tuple[str, pathlib.Path]) -> None:
    def stats() -> dict[str, int]:
        with urllib.request.urlopen(f"{engine[0]}/sim/stats", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    doc = "a long shared document about river harbors " * 40  # 1,760 chars: 27 blocks
    before = stats()
    for q in ("first question", "second question"):
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "system", "content": doc}, {"role": "user", "content": q}])
    after = stats()
    assert after["prefix_cache_queries"] > before["prefix_cache_queries"]
    # The second prompt found the shared document's blocks cached.
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] >= 25 * 16


def test_natural_stop_without_max_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}])
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and 16 <= r.usage.completion_tokens < 80


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=5)
    assert r.object == "text_completion" and r.usage is not None
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 5
    chunks = list(client.completions.create(model=MODEL, prompt="once upon a time",
                                            max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 9
    ids = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
    assert ids.usage is not None and ids.usage.prompt_tokens == 3


def test_embeddings_base64_and_float(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model=MODEL, input=["a", "b"])  # SDK asks for base64
    assert [len(d.embedding) for d in r.data] == [384, 384]
    assert abs(float(np.linalg.norm(r.data[0].embedding)) - 1.0) < 1e-5
    f = client.embeddings.create(model=MODEL, input="a", encoding_format="float", dimensions=8)
    assert len(f.data[0].embedding) == 8
    again = client.embeddings.create(model=MODEL, input="a", encoding_format="float",
                                     dimensions=8)
    assert again.data[0].embedding == f.data[0].embedding
    assert r.usage.prompt_tokens == 2


def test_error_cases(client: openai.OpenAI, engine: tuple[str, pathlib.Path]) -> None:
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model=MODEL, messages=user, n=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model=MODEL, messages=user, max_tokens=10**7)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])  # type: ignore[list-item]

    async def raw() -> list[tuple[int, dict[str, object]]]:
        out = []
        async with aiohttp.ClientSession() as http:
            for body in (b"{not json", b"[1, 2]", b'{"model": "llama-3.1-8b"}'):
                async with http.post(f"{engine[0]}/v1/chat/completions", data=body) as r:
                    out.append((r.status, await r.json()))
        return out

    for status, body in asyncio.run(raw()):
        assert status == 400
        assert set(body["error"]) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    # still serving
    assert client.models.list().data


async def test_async_concurrent_streams(engine: tuple[str, pathlib.Path]) -> None:
    aclient = openai.AsyncOpenAI(base_url=engine[0] + "/v1", api_key="x", max_retries=0)

    async def one(i: int) -> int:
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True},
        )
        n = 0
        async for c in stream:
            if c.usage is not None:
                n = c.usage.completion_tokens
        return n

    assert await asyncio.gather(*(one(i) for i in range(16))) == [12] * 16
    await aclient.close()


def test_control_fail_slow_log_reset(client: openai.OpenAI,
                                     engine: tuple[str, pathlib.Path]) -> None:
    base, log = engine
    user = [{"role": "user", "content": "x"}]
    control(base, {"action": "fail", "status": 503})
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=user, max_tokens=1)  # type: ignore[arg-type]
    assert err.value.status_code == 503
    with urllib.request.urlopen(f"{base}/health", timeout=5) as r:  # health unaffected
        assert r.status == 200
    control(base, {"action": "log", "line": "NCCL watchdog timeout (simulated)"})
    control(base, {"action": "slow", "factor": 2})
    control(base, {"action": "reset"})
    r = client.chat.completions.create(model=MODEL, messages=user, max_tokens=1)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "length"
    assert "NCCL watchdog timeout (simulated)" in log.read_text()
    req = urllib.request.Request(f"{base}/sim/control", data=b'{"action": "explode"}')
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(req, timeout=5)
    assert bad.value.code == 400
    bad.value.close()  # (an HTTPError holds the response and its socket)


def test_b64_decoding_matches_float(client: openai.OpenAI) -> None:
    body = {"model": MODEL, "input": "z", "encoding_format": "base64", "dimensions": 4}
    req = urllib.request.Request(str(client.base_url) + "embeddings",
                                 data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        raw = json.loads(r.read())
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    flt = client.embeddings.create(model=MODEL, input="z", encoding_format="float", dimensions=4)
    assert np.allclose(vec, flt.data[0].embedding, atol=1e-6)
