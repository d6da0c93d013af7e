"""Cheap capture of token usage from responses, without parsing every streamed chunk.

Streams are relayed line-aligned (a partial trailing line waits for its end), and only a line
that contains a non-null `"usage": {` is ever JSON-parsed: normally one per stream, the last.
When the ingress injected `stream_options.include_usage` (the client did not ask for it), that
usage-only chunk (`"choices": []`) is removed before the client sees it.

Usage is a claim by the provider, not a fact: token counts are clamped to [0, MAX_TOKENS]
(a `2**64-1` or a negative count must not reach the ledger). A line longer than the line cap
(an engine that never sends a newline) is passed through unscanned instead of held, so the
ingress never buffers more than one capped line per stream. `events` counts the `data:`
events relayed, so a stream the client abandoned can still be billed (`relayed_usage`).
"""

from __future__ import annotations

from typing import Any

import orjson

_MARKERS = (b'"usage":{', b'"usage": {')
MAX_TOKENS = 10_000_000  # per field and request: above any model's context
MAX_SSE_LINE = 4 * 1024 * 1024  # default line cap (bytes) before lines pass unscanned


def _has_usage(data: bytes) -> bool:
    return _MARKERS[0] in data or _MARKERS[1] in data


def _tokens(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if p is None and "input_tokens" in usage:  # the Responses API's names
        p, c = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(p, int) or isinstance(p, bool):
        return None
    if not isinstance(c, int) or isinstance(c, bool):
        c = 0
    return min(max(p, 0), MAX_TOKENS), min(max(c, 0), MAX_TOKENS)


def relayed_usage(prompt_bytes: int, events: int) -> tuple[int, int]:
    """What to bill for a stream that ended before its usage chunk (the client went away,
    the provider broke off): ~4 bytes per prompt token, one token per relayed event."""
    return min(max(1, prompt_bytes // 4), MAX_TOKENS), min(max(events, 0), MAX_TOKENS)


def usage_from_body(body: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a non-streamed response body, if present."""
    if not _has_usage(body):
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _tokens(doc.get("usage")) if isinstance(doc, dict) else None


class StreamUsageScanner:
    """Feed upstream SSE bytes; get back the bytes to send on (line-aligned)."""

    __slots__ = ("_carry", "_max_line", "_strip", "events", "usage")

    def __init__(self, strip_usage_chunk: bool, max_line: int = MAX_SSE_LINE) -> None:
        self._strip = strip_usage_chunk
        self._max_line = max_line
        self._carry = b""
        self.usage: tuple[int, int] | None = None
        self.events = 0  # `data:` events passed on

    def feed(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
            self._carry = b""
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > self._max_line:
                return data  # an overlong line: relayed as is, never held
            self._carry = data
            return b""
        if cut != len(data) - 1:
            self._carry = data[cut + 1 :]
            data = data[: cut + 1]
        self.events += data.count(b"data:")
        if _has_usage(data):
            data = self._take_usage(data)
        return data

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        if rest and _has_usage(rest):
            rest = self._take_usage(rest)
        return rest

    def _take_usage(self, data: bytes) -> bytes:
        lines = data.split(b"\n")
        out: list[bytes] = []
        drop_blank = False
        for line in lines:
            if drop_blank:
                drop_blank = False
                if not line.strip():
                    continue
            if line.startswith(b"data:") and _has_usage(line):
                try:
                    doc = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    out.append(line)
                    continue
                if isinstance(doc, dict):
                    resp = doc.get("response")  # (a Responses API response.completed event)
                    got = _tokens(resp.get("usage") if isinstance(resp, dict)
                                  else doc.get("usage"))
                    if got is not None:
                        self.usage = got
                    if self._strip and not doc.get("choices"):
                        drop_blank = True
                        continue
            out.append(line)
        return b"\n".join(out)
