"""Anthropic `/v1/messages` through a real ingress, driven by the official anthropic SDK
(x-api-key auth): translated to chat completions in front of the simulated engine (sync and
streaming agree, usage recorded), system prompt, stop_sequences, tool use, and errors in
Anthropic's own shape."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import pytest

from ._api_fabric import KEY, SIM, TOOLY, ApiFabric
from ._sdk_clients import tracked
from .test_ingress_support import raw_request

pytestmark = pytest.mark.integration


def client(base: str, key: str = KEY) -> anthropic.Anthropic:
    return tracked(anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=20))


def wait_usage(fab: ApiFabric, model: str, before: list[int]) -> list[int]:
    deadline = time.monotonic() + 30  # a loaded CI machine: the flush is asynchronous
    while fab.usage(model)[2] == before[2]:
        assert time.monotonic() < deadline, "no usage row was recorded"
        time.sleep(0.01)
    return [a - b for a, b in zip(fab.usage(model), before, strict=True)]


MSGS: Any = [{"role": "user", "content": "hello fabric"}]


def test_create_is_translated_and_its_usage_recorded(fab: ApiFabric, base: str) -> None:
    before = fab.usage(SIM)
    m = client(base).messages.create(model=SIM, max_tokens=6, system="be brief",
                                     messages=MSGS)
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 6
    assert wait_usage(fab, SIM, before) == [m.usage.input_tokens, 6, 1, 0]


def test_streaming_events_and_text_match_a_plain_create(fab: ApiFabric, base: str) -> None:
    c = client(base)
    msgs: Any = [{"role": "user", "content": [{"type": "text", "text": "stream"},
                                              {"type": "text", "text": " me"}]}]
    plain = c.messages.create(model=SIM, max_tokens=64, messages=msgs)
    before = fab.usage(SIM)
    events = list(c.messages.create(model=SIM, max_tokens=64, messages=msgs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events  # type: ignore[union-attr]
                   if e.type == "content_block_delta")
    assert text == plain.content[0].text  # type: ignore[union-attr]
    md = events[-2]
    assert md.type == "message_delta"
    assert md.delta.stop_reason == plain.stop_reason
    assert md.usage.output_tokens == plain.usage.output_tokens
    assert wait_usage(fab, SIM, before)[1:] == [plain.usage.output_tokens, 1, 0]


def test_sdk_stream_helper(base: str) -> None:
    with client(base).messages.stream(model=SIM, max_tokens=8, messages=MSGS) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens == 8


def test_system_and_stop_sequences_reach_the_engine(fab: ApiFabric, base: str) -> None:
    m = client(base).messages.create(
        model=TOOLY, max_tokens=50, system=[{"type": "text", "text": "you are terse"}],
        messages=MSGS, stop_sequences=["}"],
        extra_body={"temperature": 0.3, "top_k": 5})
    sent = fab.scripted.last("/v1/chat/completions")
    assert sent["messages"][0] == {"role": "system", "content": "you are terse"}
    assert sent["stop"] == ["}"] and sent["max_tokens"] == 50
    assert sent["temperature"] == 0.3 and sent["top_k"] == 5
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "}"


def test_tool_use_round_trip(fab: ApiFabric, base: str) -> None:
    tools: Any = [{"name": "get_weather", "description": "weather",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}]
    c = client(base)
    m = c.messages.create(model=TOOLY, max_tokens=50, messages=MSGS, tools=tools,
                          tool_choice={"type": "any"})
    use = m.content[0]
    assert use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Paris"} and m.stop_reason == "tool_use"
    sent = fab.scripted.last("/v1/chat/completions")
    assert sent["tool_choice"] == "required"
    assert sent["tools"][0]["function"]["parameters"]["properties"] == {
        "city": {"type": "string"}}
    c.messages.create(model=TOOLY, max_tokens=50, messages=[
        *MSGS, {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "sunny"}]},
    ])
    msgs = fab.scripted.last("/v1/chat/completions")["messages"]
    assert msgs[1]["tool_calls"][0]["id"] == use.id
    assert msgs[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}


def test_streamed_tool_use(base: str) -> None:
    tools: Any = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    with client(base).messages.stream(model=TOOLY, max_tokens=20, messages=MSGS,
                                      tools=tools) as s:
        final = s.get_final_message()
    assert final.content[0].type == "tool_use"
    assert final.content[0].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_errors_come_in_anthropics_shape(base: str) -> None:
    with pytest.raises(anthropic.AuthenticationError) as auth:
        client(base, key="sk-wrong").messages.create(model=SIM, max_tokens=5, messages=MSGS)
    assert auth.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": auth.value.body["error"]["message"]}}  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as nf:
        client(base).messages.create(model="nope", max_tokens=5, messages=MSGS)
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client(base).messages.create(model=SIM, max_tokens=0, messages=MSGS)
    assert bad.value.body["type"] == "error"  # type: ignore[index]


@pytest.mark.parametrize("body", [
    b"{not json", b"null", b'{"model": "llama-3.1-8b", "max_tokens": 5}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "messages": "hi"}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "messages": [{"role": "god"}]}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "messages": [{"role": "user", '
    b'"content": [{"type": "video"}]}]}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "messages": [{"role": "user", '
    b'"content": [{"type": "image", "source": {"type": "file"}}]}]}',
    b'{"model": "llama-3.1-8b", "max_tokens": "5", "messages": []}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "stop_sequences": [1], "messages": '
    b'[{"role": "user", "content": "x"}]}',
    b'{"model": "llama-3.1-8b", "max_tokens": 5, "tool_choice": {"type": "x"}, "messages": '
    b'[{"role": "user", "content": "x"}]}',
])
def test_hostile_bodies_get_400_in_anthropics_shape(base: str, body: bytes) -> None:
    r = raw_request("POST", base + "/v1/messages", body,
                    {"x-api-key": KEY, "Content-Type": "application/json"})
    assert r.status_code == 400, r.content
    doc = r.json()
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"


def test_a_body_over_the_limit_is_refused_in_anthropics_shape(base: str) -> None:
    big = b'{"model": "llama-3.1-8b", "max_tokens": 5, "messages": [{"role": "user", ' \
          b'"content": "' + b"x" * 70_000 + b'"}]}'
    r = raw_request("POST", base + "/v1/messages", big,
                    {"x-api-key": KEY, "Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and "larger than" in r.json()["error"]["message"]


def test_missing_key_is_401_in_anthropics_shape(base: str) -> None:
    r = raw_request("POST", base + "/v1/messages", b"{}", {"Content-Type": "application/json"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"


def test_an_engine_dying_mid_stream_raises_in_the_sdk(base: str) -> None:
    stream = client(base).messages.create(
        model=TOOLY, max_tokens=20, stream=True,
        messages=[{"role": "user", "content": "die mid-stream"}])
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as e:
        for ev in stream:
            seen.append(ev.type)
    assert seen[:2] == ["message_start", "content_block_start"]
    assert "mid-stream" in str(e.value)
