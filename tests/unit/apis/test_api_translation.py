"""Laws of the API translations (responses_api.py, anthropic_api.py, chat_stream.py): any
JSON body is either translated or refused with TranslationError (-> 400, never 500), any
engine reply either converts or raises ValueError (-> 502), and the stream translators turn
any byte sequence into well-formed events that end with exactly one closing event."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.apis.anthropic_api import (
    MessagesStream,
    chat_to_message,
    messages_to_chat,
    stop_reason,
)
from llmfabric.apis.responses_api import (
    ResponsesStream,
    TranslationError,
    chat_to_response,
    responses_to_chat,
)
from llmfabric.ingress.usage import usage_from_body

pytestmark = pytest.mark.unit

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.sampled_from(["model", "input", "messages", "role", "content", "type", "text",
                         "tools", "name", "max_tokens", "system", "choices", "message",
                         "delta", "tool_calls", "function", "arguments", "usage", "stream",
                         "call_id", "output", "tool_choice", "finish_reason", "source"]),
        kids, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_request_body_is_translated_or_refused_cleanly(doc: Any) -> None:
    for translate in (responses_to_chat, messages_to_chat):
        if not isinstance(doc, dict):
            continue
        try:
            out = translate(doc)
        except TranslationError as e:
            assert str(e)
            continue
        orjson.dumps(out)  # serializable
        assert isinstance(out["messages"], list)


chat_like = st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries({}, optional={
    "finish_reason": json_values, "stop_reason": json_values, "logprobs": json_values,
    "message": st.fixed_dictionaries({}, optional={
        "content": json_values, "tool_calls": json_values | st.lists(
            json_values | st.fixed_dictionaries({"function": json_values},
                                                optional={"id": json_values}), max_size=2)}),
}), max_size=2)}, optional={"usage": json_values, "created": json_values,
                            "model": json_values})


@settings(max_examples=300, deadline=None)
@given(json_values | chat_like)
def test_any_engine_reply_converts_or_raises_value_error(doc: Any) -> None:
    for convert in (chat_to_response, chat_to_message):
        with contextlib.suppress(ValueError):
            orjson.dumps(convert(doc, {"model": "m"}))


class Collect:
    def __init__(self) -> None:
        self.data = b""
        self.ended = False

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        assert content_type == "text/event-stream"

    async def write(self, data: bytes) -> None:
        assert not self.ended
        self.data += data

    async def end(self) -> None:
        self.ended = True

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for block in self.data.decode().split("\n\n"):
            if block:
                name, data = block.split("\n")
                out.append((name.removeprefix("event: "), orjson.loads(data[6:])))
        return out


def run(stream_cls: type[Any], chunks: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    sink = Collect()
    s = stream_cls(sink, {"model": "m", "stop_sequences": ["X"]}, 256)

    async def go() -> None:
        await s.start("text/event-stream", "n1")
        for c in chunks:
            await s.write(c)
        await s.end()

    asyncio.run(go())
    assert sink.ended
    return sink.events()


def sse(*docs: Any) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


CHUNKS = sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "X"}]},
    {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
)


@given(st.lists(st.integers(1, len(CHUNKS)), max_size=6))
def test_responses_stream_is_independent_of_chunking(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [CHUNKS[a:b] for a, b in zip([0, *points], [*points, len(CHUNKS)], strict=True)]
    events = run(ResponsesStream, pieces)
    assert events == [(n, e) for n, e in events if e["type"] == n]
    text = "".join(e["delta"] for n, e in events if n == "response.output_text.delta")
    assert text == "Hello"
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    last = events[-1][1]
    assert last["type"] == "response.completed"
    assert last["response"]["usage"]["input_tokens"] == 4
    assert last["response"]["output"][0]["content"][0]["text"] == "Hello"
    # The usage it reports is what the ingress records from the same chunk.
    assert usage_from_body(orjson.dumps({"usage": last["response"]["usage"]})) == (4, 2)


def test_messages_stream_reports_the_matched_stop_sequence() -> None:
    events = run(MessagesStream, [CHUNKS])
    names = [n for n, _ in events]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "X"}
    assert delta["usage"] == {"input_tokens": 4, "output_tokens": 2}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40) | st.sampled_from([CHUNKS, b"data: {\n", b"\n"]),
                max_size=6))
def test_any_bytes_give_well_formed_events_and_one_ending(chunks: list[bytes]) -> None:
    for cls, endings in ((ResponsesStream, {"response.completed", "response.incomplete",
                                            "response.failed"}),
                         (MessagesStream, {"message_stop", "error"})):
        events = run(cls, chunks)  # never raises; every event parses
        assert sum(n in endings for n, _ in events) == 1
        assert events[-1][0] in endings


def test_a_mid_stream_error_becomes_a_failure_event() -> None:
    broken = sse({"choices": [{"index": 0, "delta": {"content": "par"}}]})[:-len(
        b"data: [DONE]\n\n")] + b'data: {"error": {"message": "node died", "code": "x"}}\n\n'
    r = run(ResponsesStream, [broken])
    assert r[-1][0] == "response.failed"
    assert r[-1][1]["response"]["error"]["message"] == "node died"
    m = run(MessagesStream, [broken])
    assert m[-1] == ("error", {"type": "error", "error": {"type": "api_error",
                                                          "message": "node died"}})


def test_stop_reasons() -> None:
    assert stop_reason("length", None, None) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, None) == ("tool_use", None)
    assert stop_reason("stop", "Z", ["X"]) == ("end_turn", None)  # not one the client sent


def test_replaying_a_whole_output_as_input_is_accepted() -> None:
    # The stateless pattern: input = previous input + previous response.output.
    out = chat_to_response({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "checking",
        "tool_calls": [{"id": "call_9", "function": {"name": "f", "arguments": "{}"}}]}}]},
        {"model": "m"})
    items = [{"role": "user", "content": "q"},
             {"type": "reasoning", "id": "rs_1", "summary": []}, *out["output"],
             {"type": "function_call_output", "call_id": "call_9", "output": "42"}]
    chat = responses_to_chat({"model": "m", "input": items})
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool"]
    assert chat["messages"][1]["content"] == "checking"
    assert chat["messages"][1]["tool_calls"][0]["id"] == "call_9"


def test_an_engines_absurd_usage_is_clamped_in_every_translation() -> None:
    """The engine's usage is its claim: 2**64 - 1 tokens overflowed total_tokens (orjson
    cannot write it: a 500 or a cut stream) and reached the client as input_tokens."""
    huge = {"prompt_tokens": 2**64 - 1, "completion_tokens": 2**63}
    cap = MAX_TOKENS_PER_REQUEST
    reply = {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                 "content": "hi"},
                                        "finish_reason": "stop"}], "usage": huge}
    msg = chat_to_message(reply, {"model": "m"})
    assert msg["usage"] == {"input_tokens": cap, "output_tokens": cap}
    resp = chat_to_response(reply, {"model": "m"})
    assert resp["usage"]["total_tokens"] == 2 * cap
    assert orjson.loads(orjson.dumps([msg, resp])) == [msg, resp]  # (writable)
    stream = sse({"choices": [{"index": 0, "delta": {"content": "a"},
                               "finish_reason": "stop"}]}, {"choices": [], "usage": huge})
    events = run(ResponsesStream, [stream])
    assert events[-1][1]["response"]["usage"]["input_tokens"] == cap
    events = run(MessagesStream, [stream])
    assert events[-2][1]["usage"] == {"input_tokens": cap, "output_tokens": cap}
