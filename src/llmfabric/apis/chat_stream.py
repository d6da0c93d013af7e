"""Re-shape a streamed chat completion (OpenAI SSE) into another API's event stream.

`ChatStreamTranslator` is a `StreamSink` (app.py) that the ingress core streams chat chunks
into; it parses them line by line and calls `on_text`, `on_tool_call`, `on_finish`,
`on_usage`, `on_error`; subclasses (responses_api.py, anthropic_api.py) write their own
events to the real sink. Only the translated routes pay for this parsing: the chat, completions
and embeddings routes relay bytes untouched. A line longer than `max_line` (an engine that
never sends a newline) fails the stream instead of growing the buffer.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from llmfabric.ingress.usage import claimed_tokens


class Sink(Protocol):
    async def start(self, content_type: str, node: str, model: str = "") -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


def sse_event(name: str, obj: dict[str, Any]) -> bytes:
    """One server-sent event with an `event:` name and a JSON `data:` line."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class ChatStreamTranslator:
    """Base: parses chat.completion.chunk SSE, subclasses emit their API's events."""

    def __init__(self, inner: Sink, max_line: int = 4 * 1024 * 1024) -> None:
        self.inner = inner
        self.max_line = max_line
        self._buf = b""
        self._out: list[bytes] = []
        self.started = False
        self.finished = False  # the translated stream's closing events were written
        self.finish_reason: str | None = None
        self.stop_reason: Any = None  # vLLM: the stop string that matched
        self.usage: tuple[int, int] | None = None
        self.failed: str | None = None
        self.model = ""  # the model that answers, as the request named it ("": unknown)

    # -- StreamSink ------------------------------------------------------------------------

    def direct_writer(self) -> None:
        return None  # (every chunk is parsed here)

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        self.model = model
        await self.inner.start("text/event-stream", node, model)
        self.started = True
        self.on_start()
        await self._flush()

    async def write(self, data: bytes) -> None:
        if self.failed is not None:
            return
        buf = self._buf + data if self._buf else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) > self.max_line:
                self._buf = b""
                self._fail("upstream_failed", "the engine sent an overlong stream line")
            else:
                self._buf = buf
            await self._flush()
            return
        self._buf = buf[cut + 1:]
        for line in buf[:cut].split(b"\n"):
            if not self._line(line):
                break
        await self._flush()

    async def end(self) -> None:
        if self._buf and self.failed is None:
            self._line(self._buf)
            self._buf = b""
        if not self.finished:
            if self.failed is None:
                self.on_finish()
            self.finished = True
        await self._flush()
        await self.inner.end()

    # -- parsing ---------------------------------------------------------------------------

    def _line(self, line: bytes) -> bool:
        """Parse one SSE line; False once the stream failed."""
        line = line.strip()
        if not line.startswith(b"data:"):
            return True
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return True
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._fail("upstream_failed", "the engine sent a malformed stream event")
            return False
        if not isinstance(doc, dict):
            return True
        err = doc.get("error")
        if isinstance(err, dict):
            self._fail(str(err.get("code") or "upstream_failed"),
                       str(err.get("message") or "the engine failed mid-stream"))
            return False
        self._chunk(doc)
        return True

    def _chunk(self, doc: dict[str, Any]) -> None:
        usage = claimed_tokens(doc.get("usage"))  # (clamped: the engine's claim)
        if usage is not None:
            self.usage = usage
        choices = doc.get("choices")
        if not isinstance(choices, list):
            return
        for ch in choices:
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue  # the translated APIs carry one choice
            delta = ch.get("delta")
            if isinstance(delta, dict):
                lp = ch.get("logprobs")
                content = delta.get("content")
                if isinstance(content, str) and content:
                    lps = lp.get("content") if isinstance(lp, dict) else None
                    self.on_text(content, lps if isinstance(lps, list) else None)
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    for tc in calls:
                        if isinstance(tc, dict):
                            fn = tc.get("function")
                            fn = fn if isinstance(fn, dict) else {}
                            idx = tc.get("index", 0)
                            self.on_tool_call(
                                idx if isinstance(idx, int) else 0,
                                _opt_str(tc.get("id")), _opt_str(fn.get("name")),
                                _opt_str(fn.get("arguments")) or "",
                            )
            fr = ch.get("finish_reason")
            if isinstance(fr, str):
                self.finish_reason = fr
                self.stop_reason = ch.get("stop_reason")

    def _fail(self, code: str, message: str) -> None:
        self.failed = message
        self.on_error(code, message)
        self.finished = True

    def emit(self, name: str, obj: dict[str, Any]) -> None:
        self._out.append(sse_event(name, obj))

    async def _flush(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            await self.inner.write(data)

    # -- hooks -----------------------------------------------------------------------------

    def on_start(self) -> None: ...

    def on_text(self, text: str, logprobs: list[Any] | None) -> None: ...

    def on_tool_call(self, index: int, call_id: str | None, name: str | None,
                     arguments: str) -> None: ...

    def on_finish(self) -> None: ...

    def on_error(self, code: str, message: str) -> None: ...


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
