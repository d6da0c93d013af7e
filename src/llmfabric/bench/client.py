"""One streamed OpenAI request, timed chunk by chunk (aiohttp).

TTFT is the time from sending the request to the first chunk that carries text; every later
text-carrying chunk adds one inter-token latency (ITL) sample (a chunk holding several tokens
counts once, as in `vllm bench serve`). The output token count is the server's
`usage.completion_tokens` (requested with `stream_options.include_usage`), else the number of
text chunks. Failures are classified by kind: `http_<status>`, `timeout`, `connection`,
`stream` (broken or malformed stream), `server_error` (an error object inside the stream),
`empty` (the stream ended without text), `cancelled` (still running at the run's deadline).
An outcome's `detail` is what the server said: the `error.message` of an OpenAI error body
(else its first characters), raw and cut to `DETAIL_CHARS` (metrics.py escapes what it shows).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from llmfabric.bench.workload import RequestSpec
from llmfabric.clock import Clock

DETAIL_CHARS = 300
_ERROR_BODY_BYTES = 4096  # of an error answer: enough for its message, however long it is


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    spec: RequestSpec
    ok: bool
    error: str | None = None
    detail: str = ""
    sent_at: float = 0.0
    ttft_s: float | None = None
    latency_s: float | None = None
    itls_s: tuple[float, ...] = field(default=())
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1); None with fewer than two tokens."""
        if self.ttft_s is None or self.latency_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(spec: RequestSpec, endpoint: str, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": spec.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def server_message(error: Any) -> str:
    """The message in what a server sent about an error: an OpenAI error body or its `error`
    object (`{"error": {"message": ...}}`), a plain string, else the text itself."""
    if isinstance(error, (str, bytes)):
        try:
            error = orjson.loads(error)
        except orjson.JSONDecodeError:
            return error.decode(errors="replace") if isinstance(error, bytes) else error
    if isinstance(error, dict):
        inner = error.get("error", error)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if isinstance(message, str) and message:
            return message
        if isinstance(error.get("detail"), str):  # (FastAPI-style servers)
            return str(error["detail"])
    return error if isinstance(error, str) else orjson.dumps(error).decode()


async def _error_body(resp: aiohttp.ClientResponse) -> bytes:
    """The first `_ERROR_BODY_BYTES` of an error answer (a hostile one may never end)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= _ERROR_BODY_BYTES:
            break
    return b"".join(parts)[:_ERROR_BODY_BYTES]


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    return str(delta.get("content") or "") + str(delta.get("reasoning_content") or "")


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    *,
    clock: Clock,
    endpoint: str = "completions",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    ignore_eos: bool = True,
) -> RequestOutcome:
    """Send one streaming request and time it; never raises for request failures."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    start = clock.now()
    ttft: float | None = None
    last: float | None = None
    itls: list[float] = []
    chunks = 0
    usage: dict[str, Any] | None = None

    def fail(kind: str, detail: str = "") -> RequestOutcome:
        return RequestOutcome(spec, False, kind, detail[:DETAIL_CHARS], start, ttft, None,
                              tuple(itls))

    try:
        async with session.post(
            base_url.rstrip("/") + path,
            data=orjson.dumps(request_body(spec, endpoint, ignore_eos)),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return fail(f"http_{resp.status}", server_message(await _error_body(resp)))
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunk = orjson.loads(data)
                except orjson.JSONDecodeError:
                    return fail("stream", data.decode(errors="replace"))
                if not isinstance(chunk, dict):
                    return fail("stream", "chunk is not a JSON object")
                if chunk.get("error"):
                    return fail("server_error", server_message(chunk["error"]))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if _chunk_text(chunk):
                    now = clock.now()
                    if ttft is None:
                        ttft = now - start
                    elif last is not None:
                        itls.append(now - last)
                    last = now
                    chunks += 1
    except TimeoutError:
        return fail("timeout", f"no complete answer within {timeout_s} s")
    except aiohttp.ClientPayloadError as exc:
        return fail("stream", str(exc))
    except aiohttp.ClientError as exc:
        return fail("connection", str(exc))
    except asyncio.CancelledError:
        raise
    latency = clock.now() - start
    if ttft is None:
        return fail("empty", "the stream carried no text")
    output = int((usage or {}).get("completion_tokens") or chunks)
    prompt = int((usage or {}).get("prompt_tokens") or spec.input_len)
    return RequestOutcome(spec, True, None, "", start, ttft, latency, tuple(itls), prompt, output)
