"""Cheap capture of token usage from responses, without parsing every streamed chunk.

Streams are relayed line-aligned (a partial trailing line waits for its end), and only a line
that contains a non-null `"usage": {` is ever JSON-parsed: normally one per stream, the last.
When the ingress injected `stream_options.include_usage` (the client did not ask for it), that
usage-only chunk (`"choices": []`) is removed before the client sees it.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmfabric.accounts.policy import clamp_tokens

_MARKERS = (b'"usage":{', b'"usage": {')


def _has_usage(data: bytes) -> bool:
    return _MARKERS[0] in data or _MARKERS[1] in data


def _tokens(usage: Any) -> tuple[int, int] | None:
    """Usage is the provider's claim: counts are clamped to [0, MAX_TOKENS_PER_REQUEST]
    (a provider answering prompt_tokens = 2**64 - 1 or -5 bills a plausible amount)."""
    if not isinstance(usage, dict):
        return None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(p, bool) or not isinstance(p, int):
        return None
    return clamp_tokens(p), clamp_tokens(c) if isinstance(c, int) else 0


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

    __slots__ = ("_carry", "_strip", "usage")

    def __init__(self, strip_usage_chunk: bool) -> None:
        self._strip = strip_usage_chunk
        self._carry = b""
        self.usage: tuple[int, int] | None = None

    def feed(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
            self._carry = b""
        cut = data.rfind(b"\n")
        if cut < 0:
            self._carry = data
            return b""
        if cut != len(data) - 1:
            self._carry = data[cut + 1 :]
            data = data[: cut + 1]
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
                    got = _tokens(doc.get("usage"))
                    if got is not None:
                        self.usage = got
                    if self._strip and not doc.get("choices"):
                        drop_blank = True
                        continue
            out.append(line)
        return b"\n".join(out)
