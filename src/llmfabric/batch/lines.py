"""One batch line through the ingress, and its line of the output or error file.

`serve_through(ingress)` is the `LineServer` the runner calls: the line's body sent to
`Ingress.serve` as a non-streamed request of the principal that created the batch (auth
already done, so no bearer token is ever stored; rate limits, budgets, usage, routing,
retries and model fallbacks apply as to a live request). `stream` is forced off: a batch
answer is a whole JSON body.

Records follow OpenAI's output format: `{"id": "batch_req_...", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}`; a line answered with a non-2xx status goes
to the error file with its response, a line never sent (expired, cancelled, its key gone)
with `response: null` and an `error`. `usage_of` reads the tokens an answer reports (the
batch's `usage` sums those of its lines answered successfully).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.batch.records import Usage
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply
from llmfabric.ingress.protocols import Principal

# path, body, principal (None: an ingress without API keys) -> the complete answer
LineServer = Callable[[str, bytes, Principal | None], Awaitable[Reply]]
# key id -> the principal if that key still exists and is not revoked
PrincipalLookup = Callable[[str], Awaitable[Principal | None]]


class _NoStream:
    """The sink of a batch line: the line never streams (streamable=False)."""

    headers: dict[str, str] | None = None

    async def start(self, content_type: str, node: str, model: str = "") -> None:
        raise RuntimeError("a batch line does not stream")

    async def write(self, data: bytes) -> None:
        raise RuntimeError("a batch line does not stream")

    async def end(self) -> None:
        raise RuntimeError("a batch line does not stream")

    def direct_writer(self) -> None:
        return None


_SINK = _NoStream()
_UNREAD: Any = object()  # (`answered` without the body already read)
# The most tokens one count of an answer may add to its batch's usage: the ledger's bound
# (an engine's claim of 10**30 would not fit SQLite's integers; one of 10**12 was shown
# 43 times over what the ledger billed for that answer, when this was 2**32).
MAX_LINE_TOKENS = MAX_TOKENS_PER_REQUEST


def serve_through(ingress: Ingress) -> LineServer:
    async def serve(path: str, body: bytes, principal: Principal | None) -> Reply:
        reply = await ingress.serve(path, False, "", None, body, _SINK, principal=principal)
        if reply is None:  # (streamable=False: the core always answers whole)
            raise RuntimeError("the ingress streamed a batch line")
        return reply

    return serve


def request_body(body: dict[str, Any]) -> bytes:
    """The line's body as sent: never a stream."""
    if "stream" in body or "stream_options" in body:
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return orjson.dumps(body)


def _record(custom_id: str, response: dict[str, Any] | None,
            error: dict[str, str] | None) -> bytes:
    return orjson.dumps({"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": custom_id,
                         "response": response, "error": error})


def body_of(reply: Reply) -> Any:
    """An answer's body as its line shows it: its JSON, else its text."""
    try:
        return orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return reply.body.decode("utf-8", "replace")


def answered(custom_id: str, reply: Reply, body: Any = _UNREAD) -> bytes:
    """The record of a line the ingress answered (any status); `body`: `body_of(reply)`
    when the caller has it already."""
    shown = body_of(reply) if body is _UNREAD else body
    response = {"status_code": reply.status, "request_id": f"req_{secrets.token_hex(12)}",
                "body": shown}
    try:
        return _record(custom_id, response, None)
    except TypeError:  # (nested past the 254 levels orjson writes, though it reads 1,024: a
        # hostile answer, kept as its text, not lost as the ingress's internal_error)
        response["body"] = reply.body.decode("utf-8", "replace")
        return _record(custom_id, response, None)


def usage_of(body: Any) -> Usage:
    """The tokens an answer's `usage` reports (chat, completions and embeddings name them
    prompt/completion tokens; input/output tokens are taken too). An engine may send
    anything: a count that is no integer is 0, each is clamped to 0..MAX_LINE_TOKENS, and
    the cached (reasoning) tokens to the input (output) tokens they are part of."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Usage()

    def count(doc: Any, *names: str) -> int:
        if not isinstance(doc, dict):
            return 0
        for name in names:
            v = doc.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                return min(max(v, 0), MAX_LINE_TOKENS)
        return 0

    def details(*names: str) -> Any:
        return next((usage[n] for n in names if isinstance(usage.get(n), dict)), None)

    inp = count(usage, "prompt_tokens", "input_tokens")
    out = count(usage, "completion_tokens", "output_tokens")
    cached = count(details("prompt_tokens_details", "input_tokens_details"), "cached_tokens")
    reasoning = count(details("completion_tokens_details", "output_tokens_details"),
                      "reasoning_tokens")
    return Usage(inp, min(cached, inp), out, min(reasoning, out))


def not_sent(custom_id: str, code: str, message: str) -> bytes:
    """The record of a line that was never sent."""
    return _record(custom_id, None, {"code": code, "message": message})


def error_code(reply: Reply) -> str:
    """The OpenAI error code of an error reply ("" when it has none)."""
    try:
        doc = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else ""
