"""`/v1/responses` through a real ingress, driven by the official openai SDK: translated to
chat completions in front of the simulated engine (sync and streaming agree, usage rows
recorded), tool calls, structured outputs, stop/seed/logprobs, native pass-through, the
stateless refusal of previous_response_id, and hostile bodies (400, never 500)."""

from __future__ import annotations

import time
from typing import Any

import openai
import orjson
import pytest

from ._api_fabric import KEY, NATIVE, SIM, TOOLY, ApiFabric
from ._sdk_clients import tracked
from .test_ingress_support import raw_request

pytestmark = pytest.mark.integration


def client(base: str, key: str = KEY) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=20))


def wait_usage(fab: ApiFabric, model: str, before: list[int]) -> list[int]:
    """Usage is recorded just after the last byte went out (a stream may end first)."""
    deadline = time.monotonic() + 30  # a loaded CI machine: the flush is asynchronous
    while fab.usage(model)[2] == before[2]:
        assert time.monotonic() < deadline, "no usage row was recorded"
        time.sleep(0.01)
    after = fab.usage(model)
    return [a - b for a, b in zip(after, before, strict=True)]


def test_create_is_translated_and_its_usage_recorded(fab: ApiFabric, base: str) -> None:
    before = fab.usage(SIM)
    raw = client(base).responses.with_raw_response.create(
        model=SIM, instructions="be brief", input="hello fabric", max_output_tokens=5)
    r = raw.parse()
    assert raw.headers["x-fabric-node"] == "nSim"
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.store is False  # stateless by design
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.output_tokens == 5
    delta = wait_usage(fab, SIM, before)
    assert delta == [r.usage.input_tokens, 5, 1, 0]


def test_streaming_events_carry_the_same_text_as_a_plain_create(fab: ApiFabric,
                                                                 base: str) -> None:
    c = client(base)
    args: dict[str, Any] = {"model": SIM, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "stream me"}]}]}
    plain = c.responses.create(**args)
    before = fab.usage(SIM)
    events = list(c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text  # the simulated engine is deterministic
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == deltas
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == deltas and final.usage is not None
    assert final.usage.output_tokens == plain.usage.output_tokens  # type: ignore[union-attr]
    delta = wait_usage(fab, SIM, before)
    assert delta == [final.usage.input_tokens, final.usage.output_tokens, 1, 0]


def test_sdk_stream_helper_collects_the_final_response(base: str) -> None:
    with client(base).responses.stream(model=SIM, input="helper") as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text and final.output_text == text


def test_tool_calls_round_trip(fab: ApiFabric, base: str) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "description": "weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                   "strict": True}]
    c = client(base)
    r = c.responses.create(model=TOOLY, input="weather in Paris?", tools=tools,
                           tool_choice={"type": "function", "name": "get_weather"})
    call = r.output[0]
    assert call.type == "function_call"
    assert call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Paris"}
    sent = fab.scripted.last("/v1/chat/completions")
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tools"][0]["function"]["strict"] is True
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # The client sends the call and its output back (stateless: the whole conversation).
    c.responses.create(model=TOOLY, input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ])
    msgs = fab.scripted.last("/v1/chat/completions")["messages"]
    assert msgs[1]["tool_calls"][0]["id"] == call.call_id
    assert msgs[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}


def test_streamed_tool_call_arguments(base: str) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": {}}]
    events = list(client(base).responses.create(model=TOOLY, input="?", tools=tools,
                                                stream=True))
    args = "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta")
    assert orjson.loads(args) == {"city": "Paris"}
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == args
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output[0].type == "function_call"


def test_structured_output_stop_seed_and_logprobs_reach_the_engine(fab: ApiFabric,
                                                                   base: str) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    r = client(base).responses.create(
        model=TOOLY, input="where?", temperature=0.2, top_p=0.9, top_logprobs=2,
        include=["message.output_text.logprobs"],
        text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                         "strict": True}},
        extra_body={"stop": ["\n\n"], "seed": 7},
    )
    sent = fab.scripted.last("/v1/chat/completions")
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "place", "schema": schema, "strict": True}}
    assert sent["stop"] == ["\n\n"] and sent["seed"] == 7
    assert sent["temperature"] == 0.2 and sent["top_p"] == 0.9
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2
    assert orjson.loads(r.output_text) == {"city": "Paris"}
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.logprobs and part.logprobs[0].logprob == -0.25  # type: ignore[union-attr]


def test_native_engines_get_the_request_unchanged(fab: ApiFabric, base: str) -> None:
    before = fab.usage(NATIVE)
    r = client(base).responses.create(model=NATIVE, input="as is", max_output_tokens=9,
                                      extra_body={"custom_field": [1, 2]})
    assert r.id == "resp_native" and r.output_text == "native answer"
    assert fab.scripted.last("/v1/responses") == {
        "model": NATIVE, "input": "as is", "max_output_tokens": 9, "custom_field": [1, 2]}
    assert wait_usage(fab, NATIVE, before) == [11, 2, 1, 0]


def test_previous_response_id_is_refused_stateless(base: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(base).responses.create(model=SIM, input="again", previous_response_id="resp_1")
    assert e.value.status_code == 400
    body: Any = e.value.body
    assert body["param"] == "previous_response_id" and "stateless" in body["message"]


def test_unknown_model_and_bad_key(base: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client(base).responses.create(model="nope", input="x")
    with pytest.raises(openai.AuthenticationError):
        client(base, key="sk-wrong").responses.create(model=SIM, input="x")


@pytest.mark.parametrize("body", [
    b"{not json", b"[1, 2]", b'{"model": "llama-3.1-8b"}',
    b'{"model": "llama-3.1-8b", "input": 5}',
    b'{"model": "llama-3.1-8b", "input": [7]}',
    b'{"model": "llama-3.1-8b", "input": [{"role": "wizard", "content": "x"}]}',
    b'{"model": "llama-3.1-8b", "input": [{"type": "message", "role": "user", "content": 3}]}',
    b'{"model": "llama-3.1-8b", "input": "x", "tools": "all"}',
    b'{"model": "llama-3.1-8b", "input": "x", "tools": [{"type": "web_search"}]}',
    b'{"model": "llama-3.1-8b", "input": "x", "text": {"format": {"type": "json_schema"}}}',
    b'{"model": "llama-3.1-8b", "input": "x", "max_output_tokens": -1}',
    b'{"model": "llama-3.1-8b", "input": "x", "top_logprobs": 99}',
    b'{"model": "llama-3.1-8b", "input": "x", "tool_choice": {"type": "magic"}}',
    b'{"model": 5, "input": "x"}',
    b'{"model": ["native-resp"], "input": "x"}',
    b'{"model": "llama-3.1-8b", "input": "x", "n": 3}',
])
def test_hostile_bodies_get_400_in_openai_shape(base: str, body: bytes) -> None:
    r = raw_request("POST", base + "/v1/responses", body,
                    {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400, r.content
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]


def test_a_bad_body_without_a_key_is_401_first(base: str) -> None:
    r = raw_request("POST", base + "/v1/responses", b"{not json",
                    {"Content-Type": "application/json"})
    assert r.status_code == 401


def test_an_engine_dying_mid_stream_ends_it_with_response_failed(base: str) -> None:
    events = list(client(base).responses.create(model=TOOLY, input="die mid-stream",
                                                stream=True))
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert any(e.type == "response.output_text.delta" and e.delta == "par" for e in events)
    last = events[-1]
    assert last.type == "response.failed"
    assert last.response.error is not None and "mid-stream" in last.response.error.message


def test_native_streams_are_relayed_as_is_and_metered(fab: ApiFabric, base: str) -> None:
    before = fab.usage(NATIVE)
    events = list(client(base).responses.create(model=NATIVE, input="s", stream=True))
    assert [e.type for e in events] == ["response.output_text.delta", "response.completed"]
    sent = fab.scripted.last("/v1/responses")
    assert sent == {"model": NATIVE, "input": "s", "stream": True}  # no stream_options added
    assert wait_usage(fab, NATIVE, before) == [11, 2, 1, 0]


def test_stored_responses_do_not_exist(base: str) -> None:
    c = client(base)
    for call in (lambda: c.responses.retrieve("resp_1"), lambda: c.responses.delete("resp_1"),
                 lambda: c.responses.cancel("resp_1")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert "stateless" in str(e.value)
