"""Continuation pieces: whole events only, reading what was relayed, the continuation request,
and re-shaping the continuation's events into the client's stream."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.ingress.continuation import (
    MAX_RECORDED_BYTES,
    ContinuationRelay,
    RelayRecorder,
    continuation_wanted,
    plan_continuation,
    read_relayed,
)
from llmfabric.ingress.errors import UpstreamError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _ev(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(delta: dict[str, object], finish: str | None = None, rid: str = "c1") -> bytes:
    return _ev({"id": rid, "created": 7, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


STREAM = (_chunk({"role": "assistant", "content": ""}) + _chunk({"content": "Hello"})
          + _chunk({"content": " world"}))


@given(st.lists(st.integers(1, len(STREAM)), max_size=8))
def test_the_recorder_passes_whole_events_only_and_loses_nothing(cuts: list[int]) -> None:
    rec = RelayRecorder()
    out = b""
    pos = 0
    for c in sorted(set(cuts)):
        sent = rec.feed(STREAM[pos:c])
        assert sent == b"" or sent.endswith(b"\n\n")
        out += sent
        pos = c
    out += rec.feed(STREAM[pos:]) + rec.flush()
    assert out == STREAM and rec.recorded() == STREAM


def test_an_overlong_stream_is_not_recorded() -> None:
    rec = RelayRecorder()
    big = _chunk({"content": "x" * (MAX_RECORDED_BYTES + 10)})
    assert rec.feed(big) == big
    assert rec.overflow
    _, body, why = plan_continuation({"messages": []}, rec)
    assert body is None and "bytes" in why


@pytest.mark.hostile
def test_a_tail_that_never_ends_an_event_is_not_searched_again_and_again() -> None:
    """A provider sent lines that never ended an event, in 64-byte frames: the recorder
    re-joined and searched everything it held on each frame (4 s of CPU for 1 MiB). Held
    bytes are kept as chunks and only the new chunk is searched, so an end split across
    chunks ("\n" | "\n") is still found, and the bytes come out whole."""
    rec = RelayRecorder()
    line = b"data: " + b"x" * 58
    for _ in range(4096):  # 256 KiB without an event end
        assert rec.feed(line[:32]) == b"" and rec.feed(line[32:] + b"\n") == b""
    assert rec.feed(b"\n") == (line + b"\n") * 4096 + b"\n"  # the end split in two chunks
    assert rec.flush() == b""


@pytest.mark.hostile
def test_a_hostile_id_is_not_copied_onto_the_continuation() -> None:
    """The first provider's `id` is copied onto every continued event: a 4 MiB one turned
    20 KB of continued stream into 804 MB sent to the client."""
    assert read_relayed(_chunk({"content": "hi"}, rid="x" * 300)).id == ""
    assert read_relayed(_chunk({"content": "hi"}, rid="chatcmpl-1")).id == "chatcmpl-1"


def test_read_relayed() -> None:
    got = read_relayed(STREAM)
    assert (got.text, got.tokens, got.id, got.created, got.finished, got.blocked) == (
        "Hello world", 2, "c1", 7, False, "")
    assert read_relayed(STREAM + _chunk({}, "stop")).finished
    assert read_relayed(STREAM + b"data: [DONE]\n\n").finished
    assert read_relayed(_chunk({"tool_calls": [{"index": 0}]})).blocked


def test_plan_continuation_appends_the_assistant_prefix_and_cuts_the_limit() -> None:
    rec = RelayRecorder()
    rec.feed(STREAM)
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
           "stream": True}
    _, body, why = plan_continuation(doc, rec)
    assert why == "" and body is not None
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello world"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8 and body["stream_options"] == {"include_usage": True}
    assert doc["messages"] == [{"role": "user", "content": "hi"}]  # not mutated
    _, none, why = plan_continuation({**doc, "max_tokens": 2}, rec)
    assert none is None and "limit" in why


def test_the_continuation_keeps_the_id_drops_its_role_chunk_and_merges_usage() -> None:
    rec = RelayRecorder()
    rec.feed(STREAM)
    first = read_relayed(rec.recorded())
    relay = ContinuationRelay(first, want_usage_chunk=True)
    cont = (_chunk({"role": "assistant", "content": ""}, rid="c2") + _chunk({"content": "!"},
            rid="c2") + _chunk({}, "stop", rid="c2")
            + _ev({"id": "c2", "created": 9, "choices": [],
                   "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31}})
            + b"data: [DONE]\n\n")
    out = b"".join(relay.feed(cont[i:i + 7]) for i in range(0, len(cont), 7))
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    objs = [orjson.loads(e[6:]) for e in events[:-1]]
    assert {o["id"] for o in objs} == {"c1"} and {o["created"] for o in objs} == {7}
    assert objs[0]["choices"][0]["delta"] == {"content": "!"}
    assert objs[-1]["usage"] == {"prompt_tokens": 28, "completion_tokens": 3,
                                 "total_tokens": 31}
    assert relay.finished and relay.done and relay.usage == (28, 3)
    quiet = ContinuationRelay(first, want_usage_chunk=False)
    assert b"usage" not in quiet.feed(cont) and quiet.usage == (28, 3)


def test_who_gets_continuation() -> None:
    doc = {"messages": []}
    assert continuation_wanted(doc, CHAT, True)
    assert not continuation_wanted(doc, CHAT, False)
    assert continuation_wanted({"prompt": "once"}, COMPLETIONS, True)
    assert continuation_wanted({"prompt": ["once"]}, COMPLETIONS, True)
    for not_one_text in ({"prompt": [1, 2]}, {"prompt": ["a", "b"]},
                         {"prompt": "a", "echo": True}, {"prompt": "a", "suffix": "z"},
                         {"prompt": "a", "best_of": 2}):
        assert not continuation_wanted(not_one_text, COMPLETIONS, True)
    assert not continuation_wanted(doc, "/v1/embeddings", True)
    assert not continuation_wanted({"n": 2}, CHAT, True)
    for off in (False, "false", "off"):
        assert not continuation_wanted({"metadata": {"continuation": off}}, CHAT, True)


def _text(piece: str, finish: str | None = None, rid: str = "cmpl-1") -> bytes:
    return _ev({"id": rid, "created": 5, "object": "text_completion",
                "choices": [{"index": 0, "text": piece, "logprobs": None,
                             "finish_reason": finish}]})


def test_a_completions_stream_continues_with_the_relayed_text_appended_to_the_prompt() -> None:
    rec = RelayRecorder()
    rec.feed(_text("Once") + _text(" upon") + _text(" a"))
    doc = {"model": "m", "prompt": ["Tell: "], "max_tokens": 10, "stream": True}
    first, body, why = plan_continuation(doc, rec, COMPLETIONS)
    assert why == "" and body is not None
    assert (first.text, first.tokens, first.id) == ("Once upon a", 3, "cmpl-1")
    assert body["prompt"] == "Tell: Once upon a" and body["max_tokens"] == 7
    assert "messages" not in body and "continue_final_message" not in body
    assert body["stream_options"] == {"include_usage": True}
    assert doc["prompt"] == ["Tell: "]  # not mutated
    _, none, why = plan_continuation({**doc, "echo": True}, rec, COMPLETIONS)
    assert none is None and "one text" in why
    ended = RelayRecorder()
    ended.feed(_text("Once") + _text("", "stop"))
    assert plan_continuation(doc, ended, COMPLETIONS)[1] is None

    relay = ContinuationRelay(first, want_usage_chunk=True)
    cont = (_text(" time", rid="cmpl-2") + _text(" there", "length", rid="cmpl-2")
            + _ev({"id": "cmpl-2", "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}})
            + b"data: [DONE]\n\n")
    out = b"".join(relay.feed(cont[i:i + 5]) for i in range(0, len(cont), 5))
    objs = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert {o["id"] for o in objs} == {"cmpl-1"}
    assert [o["choices"][0]["text"] for o in objs[:2]] == [" time", " there"]
    assert relay.text == [" time", " there"] and relay.finished and relay.done
    assert relay.usage == (6, 5)  # the continuation's prompt less the 3 relayed tokens


def test_a_hostile_continuing_node_cannot_crash_bloat_or_overbill() -> None:
    """The continuing node is as untrusted as the first: a line without a newline past the
    cap ends the attempt (it grew without bound, quadratically copied, blocking the loop);
    fields of the wrong type are skipped, not raised on; its usage claim is clamped."""
    first = read_relayed(_chunk({"content": "Hi"}))
    relay = ContinuationRelay(first, want_usage_chunk=True, max_line=1024)
    relay.feed(b"data: " + b"y" * 1000)
    with pytest.raises(UpstreamError, match="over 1024 bytes"):
        relay.feed(b"y" * 100)
    relay = ContinuationRelay(first, want_usage_chunk=True, max_line=1024)
    with pytest.raises(UpstreamError, match="over 1024 bytes"):
        relay.feed(b"data: {}\n" + b"z" * 2000)
    relay = ContinuationRelay(first, want_usage_chunk=True)
    out = relay.feed(_ev({"id": "x", "created": "soon", "choices": 5})
                     + _ev({"choices": [], "usage": {"prompt_tokens": "lots",
                                                     "completion_tokens": 3}})
                     + b'data: {"choices":[],"usage":{"prompt_tokens":18446744073709551615,'
                     b'"completion_tokens":' + b"9" * 300 + b"}}\n\n"
                     + _ev({"choices": [], "usage": {"prompt_tokens": 2**64 - 1,
                                                     "completion_tokens": 2**63}}))
    assert relay.usage == (MAX_TOKENS_PER_REQUEST - 1, MAX_TOKENS_PER_REQUEST)
    last = orjson.loads(out.split(b"\n\n")[-2][6:])
    assert last["usage"]["total_tokens"] == 2 * MAX_TOKENS_PER_REQUEST - 1
    got = read_relayed(_ev({"id": 5, "created": "x", "choices": 5})
                       + _ev({"created": 2**60, "choices": [{"delta": {"content": "a"}}]}))
    assert (got.text, got.created) == ("a", 0)
