"""Cheap capture of token usage from responses, without parsing every streamed chunk.

Streams are relayed line-aligned (a partial trailing line waits for its end), and only a line
that contains a non-null `"usage": {` is ever JSON-parsed: normally one per stream, the last.
When the ingress injected `stream_options.include_usage` (the client did not ask for it), that
usage-only chunk (`"choices": []`) is removed before the client sees it.

Usage is a claim by the provider, not a fact: token counts are clamped by
accounts.policy.clamp_tokens (a `2**64-1` or a negative count must not reach the ledger).
A line longer than the line cap (an engine that never sends a newline) is passed through
unscanned instead of held, so the ingress never buffers more than one capped line per stream.
`events` counts the `data:` events relayed, so a stream the client abandoned can still be
billed (`relayed_usage`).

Engines that report no usage: the node counts a stream's tokens with the engine's tokenizer
where it can (forward/stream_usage.py) and sends a usage chunk marked `"estimated": true`;
otherwise the ingress counts them itself (the estimate below). Either way the row is marked
estimated, and the final usage chunk a client asked for is sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST, clamp_tokens

_MARKERS = (b'"usage":{', b'"usage": {')
MAX_SSE_LINE = 4 * 1024 * 1024  # default line cap (bytes) before lines pass unscanned


# Content-piece markers and their empty forms, in the four spellings engines use.
_PIECES = ((b'"content":"', b'"content":""'), (b'"content": "', b'"content": ""'),
           (b'"text":"', b'"text":""'), (b'"text": "', b'"text": ""'))


def _has_usage(data: bytes) -> bool:
    return _MARKERS[0] in data or _MARKERS[1] in data


def claimed_tokens(usage: Any) -> tuple[int, int] | None:
    """Usage is the provider's claim: counts are clamped to [0, MAX_TOKENS_PER_REQUEST]
    (a provider answering prompt_tokens = 2**64 - 1 or -5 bills a plausible amount)."""
    if not isinstance(usage, dict):
        return None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if p is None and "input_tokens" in usage:  # the Responses API's names
        p, c = usage.get("input_tokens"), usage.get("output_tokens")
    if isinstance(p, bool) or not isinstance(p, int):
        return None
    if isinstance(c, bool) or not isinstance(c, int):
        c = 0
    return clamp_tokens(p), clamp_tokens(c)


def relayed_usage(prompt_bytes: int, events: int) -> tuple[int, int]:
    """What to bill for a stream that ended before its usage chunk (the client went away,
    the provider broke off): ~4 bytes per prompt token, one token per relayed event."""
    return clamp_tokens(max(1, prompt_bytes // 4)), clamp_tokens(events)


def usage_from_body(body: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a non-streamed response body, if present."""
    if _MARKERS[0] not in body and _MARKERS[1] not in body:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    usage = doc.get("usage")
    if type(usage) is dict:  # the usual shape, answered without _tokens' general checks
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if (type(p) is int and type(c) is int and 0 <= p <= MAX_TOKENS_PER_REQUEST
                and 0 <= c <= MAX_TOKENS_PER_REQUEST):
            return p, c
    return claimed_tokens(usage)


class StreamUsageScanner:
    """Feed upstream SSE bytes; get back the bytes to send on (line-aligned)."""

    __slots__ = ("_carry", "_drop_blank", "_held_done", "_max_line", "_strip", "_want_chunk",
                 "estimated",
                 "events", "pieces", "usage")

    def __init__(self, strip_usage_chunk: bool, want_usage_chunk: bool = False,
                 max_line: int = MAX_SSE_LINE) -> None:
        self._strip = strip_usage_chunk
        self._max_line = max_line
        self._carry = b""
        self._drop_blank = False  # a stripped usage event's blank line is still to come
        self.usage: tuple[int, int] | None = None
        self.estimated = False  # the usage chunk said `"estimated": true` (a node counted)
        self.events = 0  # `data:` events passed on
        # For engines that send no usage: content pieces seen, and `data: [DONE]` held back
        # while the client asked for a usage chunk the engine has not sent.
        self._want_chunk = want_usage_chunk
        self._held_done = False
        self.pieces = 0

    def feed(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
            self._carry = b""
        if self._drop_blank and data:
            self._drop_blank = False
            if data.startswith(b"\n"):
                data = data[1:]
            elif data.startswith(b"\r\n"):
                data = data[2:]
        if not data.endswith(b"\n"):  # (engines send whole events: the usual case skips this)
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > self._max_line:
                    return data  # an overlong line: relayed as is, never held
                self._carry = data
                return b""
            self._carry = data[cut + 1 :]
            data = data[: cut + 1]
        self.events += data.count(b"data:")
        if _MARKERS[0] in data or _MARKERS[1] in data:
            data = self._take_usage(data)
        return self._count(data)

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        if rest and _has_usage(rest):
            rest = self._take_usage(rest)
        return self._count(rest) if rest else rest

    def _count(self, data: bytes) -> bytes:
        # Content pieces (for the estimate when the engine reports no usage), counted per
        # chunk: the four spellings spelled out (this runs for every chunk of every stream).
        # An empty piece (`"content":""`) contains its spelling's marker, so a spelling
        # absent from the chunk (three of the four, usually) needs no second count.
        c = data.count
        n = 0
        for marker, empty in _PIECES:
            if k := c(marker):
                n += k - c(empty)
        self.pieces += n
        if self._held_done and not data.strip():
            return b""  # the blank line that ended the held [DONE] event
        if self._want_chunk and self.usage is None and b"[DONE]" in data:
            kept: list[bytes] = []
            drop_blank = False
            for line in data.splitlines(keepends=True):
                text = line.strip()
                if text in (b"data: [DONE]", b"data:[DONE]"):
                    self._held_done = True
                    drop_blank = True  # and the blank line that ends its event
                    continue
                if drop_blank and not text:
                    drop_blank = False
                    continue
                drop_blank = False
                kept.append(line)
            data = b"".join(kept)
        return data

    def finish(self, prompt_estimate: int, model: str, chat: bool) -> tuple[Usage, bytes]:
        """The request's usage (the engine's, else the ingress's estimate, marked so) and the
        bytes still to send: the usage chunk the client asked for and the held `[DONE]`."""
        if self.usage is not None:
            usage = Usage(self.usage[0], self.usage[1], self.estimated)
        else:
            usage = Usage(prompt_estimate, max(0, self.pieces), True)
        if not self._held_done:
            return usage, b""
        return usage, usage_chunk(usage, model, chat) + b"data: [DONE]\n\n"

    def _take_usage(self, data: bytes) -> bytes:
        ends = data.endswith(b"\n")
        lines = data.split(b"\n")
        if ends:
            lines.pop()  # (the empty piece after the last newline)
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
                    claim = resp.get("usage") if isinstance(resp, dict) else doc.get("usage")
                    got = claimed_tokens(claim)
                    if got is not None:
                        self.usage = got
                        self.estimated = isinstance(claim, dict) and claim.get("estimated") is True
                    if self._strip and not doc.get("choices"):
                        drop_blank = True
                        continue
            out.append(line)
        self._drop_blank = drop_blank  # the event's blank line comes with the next bytes
        if not out:
            return b""
        return b"\n".join(out) + b"\n" if ends else b"\n".join(out)


class Usage(NamedTuple):
    """Tokens of one request; `estimated` when the ingress counted them itself."""

    prompt: int
    completion: int
    estimated: bool = False


# ---- the ingress's own count, for engines that report no usage --------------------------
# (llama.cpp's servers in streams, some OpenAI-compatible servers). Documented estimate:
# prompt = ceil(characters / 4) of every text in the prompt (message contents, `prompt`,
# embedding `input`) + 4 per chat message (role and separators); completion = the streamed
# content pieces (engines stream one token per event) or, for a whole body, ceil(characters
# / 4) of the returned text. Such rows are marked estimated in the usage ledger.


# Content parts that are not text (OpenAI chat `image_url` / `input_audio` / `file`, vLLM's
# `video_url`, `audio_url` and precomputed `image_embeds` / `audio_embeds` /
# `prompt_embeds`, the Responses API's `input_image` / `input_file`, Anthropic's `image` /
# `document` blocks): an engine turns each into tokens the text walk cannot see.
MEDIA_PART_TYPES = frozenset({"image_url", "input_image", "image", "input_audio", "audio_url",
                              "video_url", "input_file", "file", "document", "image_embeds",
                              "audio_embeds", "prompt_embeds"})
# The keys by which vLLM reads a part as media whatever its `type` (a part without one, or
# one with a `uuid`: its entrypoints/chat_utils.py): a part holding one is media too.
MEDIA_PART_KEYS = frozenset({"image_url", "audio_url", "video_url", "input_audio",
                             "image_embeds", "audio_embeds", "prompt_embeds", "image_pil"})
# The values one walk reads at most: what a walk costs is bounded by them, not by the body
# (8 MiB of empty objects, 2.8 million, took 2.6 s of the event loop), about 0.1 s at most.
MAX_PROMPT_VALUES = 100_000
_STRUCTURE = frozenset({"type", "role"})  # (fields the reservation's walk passes over)


class _Walk:
    """One walk: MEASURE summed over the texts of a prompt or reply part, five levels deep,
    reading at most MAX_PROMPT_VALUES values (`left` below 0: it stopped short).

    The billing estimate (`media` 0) reads strings, the items of lists and the `text` and
    `content` of objects. The reservation's walk (`media` > 0) reads every field of an
    object but its `type` and `role` (tool call arguments, reasoning, a tool's output: a
    chat template renders them), a list of ints as token ids, and a media part (of a
    MEDIA_PART_TYPES type or holding a MEDIA_PART_KEYS key) as MEDIA tokens plus its text."""

    __slots__ = ("left", "measure", "media", "media_parts")

    def __init__(self, measure: Callable[[str], float], media: float = 0.0) -> None:
        self.measure = measure
        self.media = media
        self.left = MAX_PROMPT_VALUES
        self.media_parts = 0

    def sum(self, value: Any, depth: int = 0) -> float:
        self.left -= 1
        if self.left < 0:
            return 0
        if isinstance(value, str):
            return self.measure(value)
        if depth > 4:
            return 0
        if isinstance(value, list):
            if self.media and value and type(value[0]) is int:
                return len(value)  # token ids (an engine refuses a list mixing them)
            return self.items(value, depth + 1)
        if isinstance(value, dict):
            if not self.media:
                return (self.sum(value.get("text"), depth + 1)
                        + self.sum(value.get("content"), depth + 1))
            kind = value.get("type")
            if (isinstance(kind, str) and kind in MEDIA_PART_TYPES) or not (
                    value.keys().isdisjoint(MEDIA_PART_KEYS)):  # (iterates the smaller)
                self.media_parts += 1
                return (self.media + self.sum(value.get("text"), depth + 1)
                        + self.sum(value.get("content"), depth + 1))
            return self.items((v for k, v in value.items() if k not in _STRUCTURE), depth + 1)
        return 0

    def items(self, values: Iterable[Any], depth: int) -> float:
        total = 0.0
        for v in values:
            if self.left < 0:
                break
            total += self.sum(v, depth)
        return total


def _prompt_tokens(doc: Mapping[str, Any], walk: _Walk) -> float:
    """A request's prompt tokens as WALK counts them + 4 per chat message, or the number of
    token ids of a `prompt`/`input` given as ids."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return walk.items(messages, 0) + 4 * len(messages)
    for key in ("prompt", "input"):
        value = doc.get(key)
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value[:8]):
            return len(value)  # already token ids
        if value is not None:
            return walk.sum(value)
    return 0


def _estimated_tokens(text: str) -> float:
    # (a quarter of an integer is exact in a float: summing these per text gives the
    # same total as counting the characters first)
    return len(text) / 4


def estimate_prompt_tokens(doc: dict[str, Any]) -> int:
    """The billing estimate of a prompt: the texts of its first MAX_PROMPT_VALUES values."""
    return math.ceil(_prompt_tokens(doc, _Walk(_estimated_tokens)))


# ---- a prompt's reservation (llmfabric.tenancy, gate.py) ------------------------------------
# An upper-ish bound, cheap: characters / 4 undercounts text outside ASCII (CJK takes about
# one token a character or more, an emoji one to three), so the characters outside ASCII
# count one token per two UTF-8 bytes (accented Latin, Cyrillic: 1 a character; CJK: 2;
# emoji: 2) and ASCII four characters a token, as the billing estimate above. An image,
# audio, video or file part counts MEDIA_PART_TOKENS, whatever its size: what an engine makes
# of one depends on the model (LLaVA-1.5: 576 an image, Llama 3.2 Vision: up to 6,404,
# Qwen2.5-VL: up to 16,384 at its largest resolution; Whisper-style audio: 750 per 30 s),
# and the hold is settled to the engine's reported usage afterwards.
MEDIA_PART_TOKENS = 4096


def _bound_tokens(text: str) -> float:
    if text.isascii():
        return len(text) / 4
    ascii_chars = len(text.encode("ascii", "ignore"))
    utf8 = len(text.encode("utf-8", "surrogatepass"))
    return ascii_chars / 4 + (utf8 - ascii_chars) / 2


class PromptBound(NamedTuple):
    """A prompt's reservation (`prompt_bound`), and what it is made of."""

    tokens: int
    media_parts: int  # each MEDIA_PART_TOKENS of `tokens`
    cut: bool  # more than MAX_PROMPT_VALUES values: `tokens` is the most a request may hold


def prompt_bound(doc: Mapping[str, Any]) -> PromptBound:
    """What a request's prompt is reserved as (an upper-ish bound of its tokens, above):
    `estimate_prompt_tokens` where the text is ASCII, more where it is not, every text a
    chat template renders (tool calls and their arguments, reasoning, native Responses
    `instructions` and tool outputs; the tool definitions as their JSON), and
    MEDIA_PART_TOKENS for each image, audio, video or file part. A prompt of more than
    MAX_PROMPT_VALUES values reserves MAX_TOKENS_PER_REQUEST (no API's prompt is that
    many pieces: it runs only alone, at a budget's start)."""
    walk = _Walk(_bound_tokens, MEDIA_PART_TOKENS)
    tokens = _prompt_tokens(doc, walk) + walk.sum(doc.get("instructions"))
    for key in ("tools", "functions"):
        if (defs := doc.get(key)) is not None:
            tokens += _bound_tokens(orjson.dumps(defs).decode())
    if walk.left < 0:
        return PromptBound(MAX_TOKENS_PER_REQUEST, walk.media_parts, True)
    return PromptBound(min(math.ceil(tokens), MAX_TOKENS_PER_REQUEST), walk.media_parts, False)


def prompt_token_bound(doc: Mapping[str, Any]) -> int:
    """`prompt_bound(doc).tokens`."""
    return prompt_bound(doc).tokens


def estimate_completion_from_body(body: bytes) -> int:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return 0
    walk = _Walk(_estimated_tokens)
    tokens = 0.0
    for c in choices[:1000]:
        if isinstance(c, dict):
            tokens += walk.sum(c.get("text")) + walk.sum(c.get("message"))
    return math.ceil(tokens)


def usage_chunk(usage: Usage, model: str, chat: bool, mark_estimated: bool = False) -> bytes:
    """The final `choices: []` usage event OpenAI streams send for include_usage;
    `mark_estimated` adds `"estimated": true` to the usage (a node's count, see
    forward/stream_usage.py: the ingress keeps such rows marked)."""
    counts: dict[str, Any] = {"prompt_tokens": usage.prompt,
                              "completion_tokens": usage.completion,
                              "total_tokens": usage.prompt + usage.completion}
    if mark_estimated:
        counts["estimated"] = True
    doc: dict[str, Any] = {"id": "fabric-usage", "object": "chat.completion.chunk" if chat else
           "text_completion", "created": int(time.time()), "model": model, "choices": [],
           "usage": counts}
    return b"data: " + orjson.dumps(doc) + b"\n\n"
