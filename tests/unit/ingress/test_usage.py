from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.ingress.usage import StreamUsageScanner, usage_from_body


def _event(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


CONTENT = [_event({"choices": [{"delta": {"content": f"t{i}"}}], "usage": None})
           for i in range(5)]
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
STREAM = b"".join(CONTENT) + USAGE + b"data: [DONE]\n\n"


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts, last = [], 0
    for p in points:
        parts.append(data[last:p])
        last = p
    parts.append(data[last:])
    return [p for p in parts if p]


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30), st.booleans())
def test_scanner_relays_everything_and_finds_usage_however_the_bytes_are_split(
    cuts: list[int], strip: bool
) -> None:
    scanner = StreamUsageScanner(strip_usage_chunk=strip)
    out = b"".join(scanner.feed(p) for p in _splits(STREAM, cuts)) + scanner.flush()
    assert scanner.usage == (11, 5)
    expected = b"".join(CONTENT) + (b"" if strip else USAGE) + b"data: [DONE]\n\n"
    assert out == expected


def test_usage_attached_to_a_content_chunk_is_kept_even_when_stripping() -> None:
    ev = _event({"choices": [{"delta": {"content": "x"}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    s = StreamUsageScanner(strip_usage_chunk=True)
    assert s.feed(ev) == ev and s.usage == (1, 1)


def test_usage_from_body() -> None:
    assert usage_from_body(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == (3, 4)
    assert usage_from_body(b'{"usage": {"prompt_tokens": 3}}') == (3, 0)
    assert usage_from_body(b'{"choices": []}') is None
    assert usage_from_body(b'{"usage": {') is None
