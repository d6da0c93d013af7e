"""The HTTP edge both engines' aiohttp servers share (sim_server.py, torchref/server.py).

JSON responses and OpenAI-shaped errors, request bodies read and validated at the boundary
(the same status, message and error code from either engine), the server-sent-event stream of
a streamed completion (ChunkStream), and the listening socket with vLLM's start-up line (the
node agent waits for "Uvicorn running on").
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, TypeVar

import orjson
import pydantic
from aiohttp import web

from llmfabric.engines import protocol as p

M = TypeVar("M", bound=pydantic.BaseModel)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI error body (`{"error": {...}}`) with `status` (and `headers`: Retry-After)."""
    return json_response(p.error_body(message, type_, code, param), status, headers)


async def read_object(request: web.Request, what: str) -> dict[str, Any] | web.Response:
    """The JSON object a control route takes, or its 400 (`what`: "body", "control body")."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return error_response(400, f"{what} must be JSON")
    if not isinstance(body, dict):
        return error_response(400, f"{what} must be a JSON object")
    return body


async def read_request(
    request: web.Request, model_cls: type[M], max_tokens: int, message_tokens: int = 1
) -> M | web.Response:
    """An OpenAI request body validated as `model_cls`, or the 400 OpenAI's API answers;
    `max_tokens`: the largest context served, `message_tokens`: the fewest tokens a chat
    message takes (more items than fit are refused before validation,
    protocol.too_many_items)."""
    try:
        data = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return error_response(400, "request body is not valid JSON", code="invalid_json")
    if not isinstance(data, dict):
        return error_response(400, "request body must be a JSON object", code="invalid_json")
    too_many = p.too_many_items(data, max_tokens, message_tokens)
    if too_many is not None:
        return error_response(400, too_many[0], code=too_many[1], param=too_many[2])
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as exc:
        msg, param = p.validation_message(exc)
        return error_response(400, msg, code="invalid_value", param=param)


async def read_served_request(
    request: web.Request, model_cls: type[M], served: Container[str], max_tokens: int,
    message_tokens: int
) -> M | web.Response:
    """read_request, then the 404 of a model this engine does not serve and the 400 of
    n != 1 (both engines generate one choice a request)."""
    req = await read_request(request, model_cls, max_tokens, message_tokens)
    if isinstance(req, web.Response):
        return req
    model = getattr(req, "model", "")
    if model not in served:
        return model_not_found(model)
    if getattr(req, "n", 1) != 1:
        return error_response(400, "only n=1 is supported", code="invalid_value", param="n")
    return req


def model_not_found(model: str) -> web.Response:
    return error_response(
        404,
        f"The model `{model}` does not exist.",
        type_="NotFoundError",
        code="model_not_found",
        param="model",
    )


class ChunkStream:
    """A streamed chat or text completion as vLLM sends it: the assistant-role chunk (chat),
    one chunk a piece, the finish chunk, the usage chunk when the request asked for it
    (`stream_options.include_usage`), then `data: [DONE]`."""

    def __init__(
        self,
        resp: web.StreamResponse,
        req: p.ChatRequest | p.CompletionRequest,
        kind: str,
        rid: str,
        created: int,
    ) -> None:
        self.resp, self.kind, self.rid, self.created = resp, kind, rid, created
        self.model, self.usage = req.model, req.include_usage

    @classmethod
    async def open(
        cls,
        request: web.Request,
        req: p.ChatRequest | p.CompletionRequest,
        kind: str,
        rid: str,
        created: int,
    ) -> ChunkStream:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        return cls(resp, req, kind, rid, created)

    async def send(self, obj: dict[str, Any]) -> None:
        await self.resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")

    async def begin(self) -> None:
        if self.kind == "chat":
            await self.send(
                p.chat_chunk(
                    self.rid,
                    self.created,
                    self.model,
                    {"role": "assistant", "content": ""},
                    None,
                    self.usage,
                )
            )

    async def piece(self, text: str) -> None:
        if self.kind == "chat":
            await self.send(
                p.chat_chunk(
                    self.rid, self.created, self.model, {"content": text}, None, self.usage
                )
            )
        else:
            await self.send(
                p.text_chunk(self.rid, self.created, self.model, text, None, self.usage)
            )

    async def end(self, finish: str, prompt_tokens: int, completion_tokens: int) -> None:
        if self.kind == "chat":
            await self.send(
                p.chat_chunk(self.rid, self.created, self.model, {}, finish, self.usage)
            )
        else:
            await self.send(
                p.text_chunk(self.rid, self.created, self.model, "", finish, self.usage)
            )
        if self.usage:
            obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            await self.send(
                p.usage_chunk(
                    self.rid, self.created, self.model, obj, prompt_tokens, completion_tokens
                )
            )
        await self.resp.write(b"data: [DONE]\n\n")
        await self.resp.write_eof()


async def listen(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve `app` on host:port (signals are the caller's) and print vLLM's ready line."""
    # handler_cancellation: a client that hangs up cancels its handler, which frees the
    # request's sequence (and KV) as vLLM aborts it; aiohttp's default ran a non-streamed
    # request to its last token for nobody.
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"INFO: Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", flush=True)
    return runner
