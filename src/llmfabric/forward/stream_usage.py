"""The node counts a stream's tokens when its engine reports none (llama.cpp's servers).

Why on the node: the engine's tokenizer is next to it (a loopback call of about a
millisecond), every path to the engine (sealed peer frames, the pinned HTTPS listener)
goes through the node's EngineProxy, and the count is known before the stream ends, so the
usage chunk a client asked for (`stream_options.include_usage`, which the ingress also
injects when it meters) carries it in time.

For a streamed `/v1/chat/completions` or `/v1/completions` request that asked for usage,
to an engine whose adapter says `counts_stream_usage`, the relay (`CountingUpstream`) is
line-aligned and:
- counts completion tokens from the events themselves: one per choice event that carries
  text (`text`, `delta.content`, tool calls; the role-only first chat event and an empty
  final event with a finish reason are not tokens). llama-cpp-python sends one event per
  generated token, empty text included, so this count is exact (re-tokenizing the text is
  not: a sampled sequence need not be the tokenizer's own split of its text);
- when the engine ends with `data: [DONE]` and sent no usage, holds `[DONE]`, counts the
  prompt with the engine's tokenizer (agent/tokenize.py; chat: vLLM renders its template,
  other engines count the message contents + 4 per message for the template), and sends a
  usage chunk marked `"estimated": true` before `[DONE]`. The ingress reads it like any
  usage chunk and keeps the row marked estimated.
Any failure, an over-long prompt, or (llama-cpp-python) another request in flight on the
engine, whose stream a tokenize call would cut short, falls back to the ingress's documented
estimate for the prompt (ingress/usage.py); the completion count stays the event count.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson

from llmfabric.agent.engines import EngineKind, flag_value
from llmfabric.agent.tokenize import EngineTokenizer
from llmfabric.ingress.errors import UpstreamError
from llmfabric.ingress.protocols import Upstream, read_chunks_capped
from llmfabric.ingress.usage import Usage, estimate_prompt_tokens, usage_chunk
from llmfabric.telemetry.node_hop import NodeHop

COUNTED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
CHAT_MESSAGE_OVERHEAD = 4  # role and separators the template adds per message (estimate)
_MAX_LINE = 1024 * 1024  # an event longer than this is counted as one token, unparsed
_USAGE = (b'"usage":{', b'"usage": {')
_DONE = (b"data: [DONE]", b"data:[DONE]")

Opener = Callable[[str, bytes], Awaitable[Upstream]]


def wanted(path: str, body: bytes) -> dict[str, Any] | None:
    """The request document when this request is a stream that asked for usage."""
    if path not in COUNTED_PATHS or b"include_usage" not in body:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("stream") is not True:
        return None
    so = doc.get("stream_options")
    return doc if isinstance(so, dict) and so.get("include_usage") is True else None


def choice_tokens(event: Any) -> int:
    """Generated tokens one stream event carries (see the module docstring)."""
    if not isinstance(event, dict):
        return 0
    choices = event.get("choices")
    if not isinstance(choices, list):
        return 0
    n = 0
    for c in choices[:1024]:
        if not isinstance(c, dict):
            continue
        finished = c.get("finish_reason") is not None
        if "text" in c:
            text = c.get("text")
            n += 1 if isinstance(text, str) and (text or not finished) else 0
            continue
        delta = c.get("delta")
        if not isinstance(delta, dict):
            continue
        content = delta.get("content")
        text_event = isinstance(content, str) and (content or not (finished or "role" in delta))
        n += 1 if text_event or delta.get("tool_calls") or delta.get("reasoning_content") else 0
    return n


class StreamTally:
    """Line-aligned pass over an SSE stream: counts token events, notes an engine usage
    chunk, and holds back `data: [DONE]` (with its blank line) while none came."""

    __slots__ = ("_carry", "_drop_blank", "completion", "held_done", "saw_usage")

    def __init__(self) -> None:
        self._carry = b""
        self._drop_blank = False
        self.completion = 0
        self.held_done = False
        self.saw_usage = False

    def feed(self, data: bytes) -> bytes:
        if self._carry:
            data = self._carry + data
            self._carry = b""
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > _MAX_LINE:
                self.completion += data.count(b"data:")
                return data  # an overlong line: passed on, never held
            self._carry = data
            return b""
        if cut != len(data) - 1:
            self._carry = data[cut + 1 :]
            data = data[: cut + 1]
        return self._lines(data)

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        return self._lines(rest) if rest else b""

    def _lines(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for line in data.splitlines(keepends=True):
            text = line.strip()
            if self._drop_blank:
                self._drop_blank = False
                if not text:
                    continue
            if not text.startswith(b"data:"):
                out.append(line)
                continue
            if text in _DONE and not self.saw_usage:
                self.held_done = True
                self._drop_blank = True
                continue
            if _USAGE[0] in text or _USAGE[1] in text:
                self.saw_usage = True
            elif len(text) > _MAX_LINE:
                self.completion += 1
            elif text not in _DONE:
                with contextlib.suppress(orjson.JSONDecodeError):
                    self.completion += choice_tokens(orjson.loads(text[5:]))
            out.append(line)
        return b"".join(out)


class StreamUsageCounter:
    """Wraps the engine proxy's `open` (EngineProxy(around=...)) for one engine."""

    def __init__(self, kind: EngineKind, tokenizer: EngineTokenizer | None,
                 argv: Sequence[str] = ()) -> None:
        self.kind = kind
        self.tokenizer = tokenizer
        # llama-cpp-python run with `--interrupt_requests False` waits instead of cutting
        self.interrupts = kind.tokenize_interrupts and (
            (flag_value(argv, "--interrupt_requests") or "true").lower()
            not in ("false", "0", "no", "off"))
        self._active = 0  # requests open on the engine through this node
        self._gate = asyncio.Event()  # cleared while an interrupting tokenize call runs
        self._gate.set()
        self.counted = 0  # streams the node counted (with the engine's tokenizer or not)
        self.tokenized = 0  # ... whose prompt the engine's tokenizer counted

    async def open(self, path: str, body: bytes, opener: Opener) -> Upstream:
        while not self._gate.is_set():  # (re-checked: another call may start meanwhile)
            await self._gate.wait()  # (a tokenize call of a millisecond or so)
        doc = wanted(path, body)
        self._active += 1
        try:
            up = await opener(path, body)
        except BaseException:
            self._active -= 1
            raise
        return CountingUpstream(self, up, doc)

    def _release(self) -> None:
        self._active -= 1

    async def prompt_tokens(self, doc: dict[str, Any]) -> tuple[int, bool]:
        """(prompt tokens, counted by the engine's tokenizer)."""
        tok = self.tokenizer
        n: int | None = None
        if tok is not None and (not self.interrupts or self._active <= 1):
            if self.interrupts:
                self._gate.clear()  # new requests wait: they would be cut by our call
            try:
                n = await self._count(tok, doc)
            finally:
                self._gate.set()
        if n is None:
            return estimate_prompt_tokens(doc), False
        self.tokenized += 1
        return n, True

    @staticmethod
    async def _count(tok: EngineTokenizer, doc: dict[str, Any]) -> int | None:
        model = doc.get("model")
        model = model if isinstance(model, str) else ""
        messages = doc.get("messages")
        if isinstance(messages, list):
            if tok.applies_chat_template:
                return await tok.count_messages(messages, model)
            texts = [_text(m.get("content")) for m in messages if isinstance(m, dict)]
            n = await tok.count("\n".join(texts), model)
            return None if n is None else n + CHAT_MESSAGE_OVERHEAD * len(messages)
        prompt = doc.get("prompt")
        if isinstance(prompt, str):
            return await tok.count(prompt, model)
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, int) for p in prompt):
                return len(prompt)  # token ids already
            total = 0
            for p in prompt[:64]:
                if isinstance(p, list):
                    total += len(p)
                    continue
                got = await tok.count(p, model) if isinstance(p, str) else None
                if got is None:
                    return None
                total += got
            return total if len(prompt) <= 64 else None
        return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


class CountingUpstream:
    """An engine response relayed as is, except a stream that needs counting (above)."""

    __slots__ = ("_closed", "_doc", "_owner", "_up")

    def __init__(self, owner: StreamUsageCounter, up: Upstream,
                 doc: dict[str, Any] | None) -> None:
        self._owner, self._up, self._doc = owner, up, doc
        self._closed = False

    @property
    def status(self) -> int:
        return self._up.status

    @property
    def content_type(self) -> str:
        return self._up.content_type

    async def read(self) -> bytes:
        return await self._up.read()

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        doc = self._doc
        if (doc is None or self._up.status != 200
                or not self._up.content_type.startswith("text/event-stream")):
            async for data in self._up.chunks():
                yield data
            return
        tally = StreamTally()
        try:
            async for data in self._up.chunks():
                out = tally.feed(data)
                if out:
                    yield out
                if tally.held_done:
                    break  # the answer is complete: an engine that keeps the body open
                    # after its [DONE] held the client until the read timed out (120 s)
        except (aiohttp.ClientError, TimeoutError, UpstreamError):
            # The engine finished ([DONE] held) and then broke the connection (llama-cpp-
            # python cancels an interrupted stream right after its [DONE]): the answer is
            # complete, so finish it; before [DONE] the relay fails as it would unwrapped.
            if not tally.held_done:
                raise
        rest = tally.flush()
        if rest:
            yield rest
        if not tally.held_done:
            return
        if not tally.saw_usage:
            prompt, _ = await self._owner.prompt_tokens(doc)
            self._owner.counted += 1
            model = doc.get("model")
            yield usage_chunk(Usage(prompt, tally.completion, True),
                              model if isinstance(model, str) else "",
                              "messages" in doc, mark_estimated=True)
        yield b"data: [DONE]\n\n"

    async def read_capped(self, limit: int) -> bytes:
        return await read_chunks_capped(self.chunks(), limit)

    def socket_relay(self) -> None:
        return None  # (the count needs every chunk: never relayed from the socket)

    @property
    def hop(self) -> NodeHop:
        return self._up.hop

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner._release()
        await self._up.aclose()
