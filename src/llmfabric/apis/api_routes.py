"""The routes beyond chat/completions/embeddings: translated APIs and generic pass-through.

- `POST /v1/responses`: translated to chat completions (responses_api.py), or passed through
  unchanged to engines that serve it themselves (`IngressConfig.native_responses_models`).
- `POST /v1/messages` (Anthropic): translated to chat completions (anthropic_api.py); the key
  may come in `x-api-key`; errors in Anthropic's shape.
- the paths in paths.PASSTHROUGH_ROUTES (rerank, score, tokenize, detokenize): relayed as
  is (root paths travel under /v1/ through the fabric).

All of them go through `Ingress.serve` (auth, rate limits, routing, retries, usage capture),
so usage rows come from the engine's chat usage; only these routes pay for the translation.
A body that cannot be translated is answered 400 after the key was checked (401 first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from llmfabric.apis.anthropic_api import (
    MessagesStream,
    anthropic_error,
    chat_to_message,
    messages_to_chat,
)
from llmfabric.apis.chat_stream import ChatStreamTranslator
from llmfabric.apis.responses_api import (
    ResponsesStream,
    TranslationError,
    chat_to_response,
    refuse_stateful,
    responses_to_chat,
)
from llmfabric.ingress.errors import Reply, error_reply
from llmfabric.ingress.paths import NATIVE_RESPONSES_PATH, PASSTHROUGH_PATHS, PASSTHROUGH_ROUTES
from llmfabric.ingress.protocols import BodyReader, StreamSink
from llmfabric.ingress.request_body import BadJson, load_object

if TYPE_CHECKING:  # (app.py builds ApiRoutes; no runtime import back)
    from llmfabric.ingress.app import Ingress


CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
EXTRA_POST_PATHS = frozenset({RESPONSES, MESSAGES, *PASSTHROUGH_PATHS})


def not_stored() -> Reply:
    """GET/DELETE /v1/responses/{id} (and cancel): nothing is stored (store=false)."""
    return error_reply(404, "responses are not stored: this fabric is stateless (store=false "
                       "semantics); keep the response you received and send the whole "
                       "conversation in 'input'", "response_not_stored")


def anthropic_auth(authorization: str, x_api_key: str | None) -> str:
    """Anthropic clients send `x-api-key`; the core expects a bearer header."""
    if not authorization and x_api_key:
        return "Bearer " + x_api_key
    return authorization


class ApiRoutes:
    """Serves EXTRA_POST_PATHS over an `Ingress` (transport-agnostic, like `Ingress.serve`)."""

    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress
        self.native = frozenset(ingress.config.native_responses_models)

    async def serve(self, path: str, authorization: str, providers: str | None,
                    body_in: bytes | BodyReader, sink: StreamSink,
                    session_id: str | None = None) -> Reply | None:
        """One request to an EXTRA_POST_PATHS path: a complete Reply, or None when the
        response was streamed into `sink`. `session_id`: the X-Session-Id header."""
        if path in PASSTHROUGH_PATHS:
            return await self.ingress.serve(PASSTHROUGH_ROUTES[path], False, authorization,
                                            providers, body_in, sink, session_id)
        if isinstance(body_in, bytes):
            body = body_in
        else:  # the aiohttp front reads lazily; the key goes first
            who = await self._check_key(authorization)
            if who is not None:
                return self._shape(path, who)
            got = await body_in()
            if isinstance(got, Reply):
                return self._shape(path, got)
            body = got
        if path == RESPONSES:
            return await self._responses(authorization, providers, body, sink, session_id)
        return await self._messages(authorization, providers, body, sink, session_id)

    # -- /v1/responses ---------------------------------------------------------------------

    async def _responses(self, authorization: str, providers: str | None, body: bytes,
                         sink: StreamSink, session_id: str | None) -> Reply | None:
        try:
            doc = _object(body)
            refuse_stateful(doc)
            if self._is_native(doc):
                return await self.ingress.serve(NATIVE_RESPONSES_PATH, True, authorization,
                                                providers, body, sink, session_id)
            chat = responses_to_chat(doc)
        except TranslationError as e:
            return await self._refused(authorization, RESPONSES, 400, str(e), e.code, e.param)
        stream = chat.get("stream") is True
        ts = ResponsesStream(sink, doc, self.ingress.config.max_sse_line_bytes) if stream \
            else None
        reply = await self.ingress.serve(CHAT, True, authorization, providers,
                                         orjson.dumps(chat), ts or sink, session_id)
        return _translate(reply, ts, lambda d: chat_to_response(d, doc), RESPONSES)

    def _is_native(self, doc: dict[str, Any]) -> bool:
        """Whether every model the request names (`model` and its fallback `models`) is
        served through the engines' own /v1/responses (else it is translated)."""
        if not self.native:
            return False
        model, models = doc.get("model"), doc.get("models")
        names = [] if model is None else [model]
        if models is not None:
            if not isinstance(models, list):
                return False  # (translated: the core refuses it)
            names += models
        return bool(names) and all(isinstance(n, str) for n in names) and (
            "*" in self.native or all(n in self.native for n in names))

    # -- /v1/messages ----------------------------------------------------------------------

    async def _messages(self, authorization: str, providers: str | None, body: bytes,
                        sink: StreamSink, session_id: str | None) -> Reply | None:
        try:
            doc = _object(body)
            chat = messages_to_chat(doc)
        except TranslationError as e:
            return await self._refused(authorization, MESSAGES, 400, str(e), e.code, e.param)
        stream = chat.get("stream") is True
        ms = MessagesStream(sink, doc, self.ingress.config.max_sse_line_bytes) if stream \
            else None
        reply = await self.ingress.serve(CHAT, True, authorization, providers,
                                         orjson.dumps(chat), ms or sink, session_id)
        return _translate(reply, ms, lambda d: chat_to_message(d, doc), MESSAGES)

    # -- errors ----------------------------------------------------------------------------

    async def _check_key(self, authorization: str) -> Reply | None:
        if self.ingress.auth is None:
            return None
        who = await self.ingress.authenticate_header(authorization)
        return who if isinstance(who, Reply) else None

    async def _refused(self, authorization: str, path: str, status: int, message: str,
                       code: str, param: str | None) -> Reply:
        """A body the translation refuses: 401 first if the key is bad, else 400."""
        bad_key = await self._check_key(authorization)
        if bad_key is not None:
            return self._shape(path, bad_key)
        self.ingress.metrics.observe_error("", status, code)
        return self._shape(path, error_reply(status, message, code, param))

    @staticmethod
    def _shape(path: str, reply: Reply) -> Reply:
        return to_anthropic(reply) if path == MESSAGES else reply


def _object(body: bytes) -> dict[str, Any]:
    try:
        doc = load_object(body)
    except BadJson as e:
        raise TranslationError(str(e), None, e.code) from None
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise TranslationError("'stream' must be a boolean", "stream", "invalid_stream")
    return doc


def _translate(reply: Reply | None, stream: ChatStreamTranslator | None,
               convert: Callable[[Any], dict[str, Any]], path: str) -> Reply | None:
    """The core's answer for the translated API: errors reshaped, 200 bodies converted."""
    if reply is None:
        return None  # streamed through the translator
    if reply.status != 200:
        return to_anthropic(reply) if path == MESSAGES else reply
    try:
        out = orjson.dumps(convert(orjson.loads(reply.body)))
    except (ValueError, TypeError, KeyError, AttributeError):  # (JSON errors too)
        bad = error_reply(502, "the engine's reply could not be translated", "upstream_failed")
        return to_anthropic(bad) if path == MESSAGES else bad
    return Reply(200, out, "application/json", reply.node, reply.headers, reply.model)


def to_anthropic(reply: Reply) -> Reply:
    """An OpenAI-shaped error Reply in Anthropic's error shape."""
    message = "request failed"
    try:
        doc = orjson.loads(reply.body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    except orjson.JSONDecodeError:
        pass
    return Reply(reply.status, anthropic_error(reply.status, message), "application/json",
                 reply.node, reply.headers, reply.model)
