"""The ingress's own token count for engines that report no usage, and the include_usage
chunk it sends when the engine does not."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.ingress.usage import (
    StreamUsageScanner,
    Usage,
    estimate_completion_from_body,
    estimate_prompt_tokens,
)

pytestmark = pytest.mark.unit


def _event(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


# llama-cpp-python's stream shape: a role chunk, one chunk per token, a finish chunk, no usage.
ROLE = _event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
TOKENS = [_event({"choices": [{"delta": {"content": w}}]}) for w in ("Hel", "lo", " you")]
FINISH = _event({"choices": [{"delta": {}, "finish_reason": "stop"}]})
NO_USAGE = ROLE + b"".join(TOKENS) + FINISH + b"data: [DONE]\n\n"


def test_prompt_estimate() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 10},
                         {"role": "system", "content": [{"type": "text", "text": "y" * 6}]}]}
    assert estimate_prompt_tokens(chat) == 4 + 2 * 4  # ceil(16 / 4) + 4 per message
    assert estimate_prompt_tokens({"prompt": "abcdefghi"}) == 3
    assert estimate_prompt_tokens({"prompt": [1, 2, 3, 4, 5]}) == 5  # token ids
    assert estimate_prompt_tokens({"input": ["abcd", "efgh"]}) == 2
    assert estimate_prompt_tokens({}) == 0


def test_completion_estimate_from_a_body() -> None:
    body = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "z" * 9}}]})
    assert estimate_completion_from_body(body) == 3
    assert estimate_completion_from_body(b'{"choices": [{"text": "abcd"}]}') == 1
    assert estimate_completion_from_body(b"not json") == 0


def test_stream_without_usage_is_counted_and_the_chunk_added_before_done() -> None:
    s = StreamUsageScanner(strip_usage_chunk=False, want_usage_chunk=True)
    out = s.feed(NO_USAGE) + s.flush()
    assert out == ROLE + b"".join(TOKENS) + FINISH  # [DONE] held back
    usage, tail = s.finish(prompt_estimate=9, model="tiny", chat=True)
    assert usage == Usage(9, 3, True)
    events = [ln for ln in tail.split(b"\n") if ln]
    assert events[-1] == b"data: [DONE]"
    chunk = orjson.loads(events[0][len(b"data: "):])
    assert chunk["choices"] == [] and chunk["object"] == "chat.completion.chunk"
    assert chunk["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def test_engine_usage_wins_and_nothing_is_added() -> None:
    usage_ev = _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    stream = ROLE + b"".join(TOKENS) + usage_ev + b"data: [DONE]\n\n"
    s = StreamUsageScanner(strip_usage_chunk=False, want_usage_chunk=True)
    out = s.feed(stream) + s.flush()
    assert out == stream
    assert s.finish(1, "m", True) == (Usage(5, 3, False), b"")


def test_client_did_not_ask_no_chunk_but_still_counted() -> None:
    s = StreamUsageScanner(strip_usage_chunk=True, want_usage_chunk=False)
    out = s.feed(NO_USAGE) + s.flush()
    assert out == NO_USAGE
    usage, tail = s.finish(2, "m", chat=False)
    assert (usage, tail) == (Usage(2, 3, True), b"")


@given(st.lists(st.integers(min_value=0, max_value=len(NO_USAGE)), max_size=12))
def test_split_anywhere_same_result(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts, last = [], 0
    for p in points:
        parts.append(NO_USAGE[last:p])
        last = p
    parts.append(NO_USAGE[last:])
    s = StreamUsageScanner(strip_usage_chunk=False, want_usage_chunk=True)
    out = b"".join(s.feed(p) for p in parts if p) + s.flush()
    usage, tail = s.finish(1, "m", True)
    assert out == ROLE + b"".join(TOKENS) + FINISH
    assert usage == Usage(1, 3, True) and tail.endswith(b"data: [DONE]\n\n")
