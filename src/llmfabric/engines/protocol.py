"""OpenAI API request validation (pydantic, at the boundary) and response/chunk builders.

Shapes follow OpenAI's API reference and what vLLM's OpenAI server sends, including
`stream_options.include_usage` (every chunk carries `"usage": null`, then one final chunk
with `"choices": []` and the usage) and `data: [DONE]`. Unknown sampling fields
(temperature, top_p, seed, ...) are accepted and ignored, as the timing does not depend on them.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any, Literal

import numpy as np
import pydantic


class _Base(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


class StreamOptions(_Base):
    include_usage: bool = False


class _Generation(_Base):
    model: str = pydantic.Field(min_length=1)
    max_tokens: int | None = pydantic.Field(default=None, ge=1)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension: always generate max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None

    @pydantic.field_validator("content")
    @classmethod
    def _text_parts_are_strings(
        cls, v: str | list[dict[str, Any]] | None,
    ) -> str | list[dict[str, Any]] | None:
        # (OpenAI's too) a part's text that is not a string is refused here: str() of one
        # nested 1,000 deep raised RecursionError in the handler, a 500
        if isinstance(v, list) and any(not isinstance(p.get("text", ""), str) for p in v):
            raise ValueError("a content part's text must be a string")
        return v

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if self.content is None:
            return ""
        return "".join(p.get("text", "") for p in self.content)


class ChatRequest(_Generation):
    messages: list[ChatMessage] = pydantic.Field(min_length=1)
    max_completion_tokens: int | None = pydantic.Field(default=None, ge=1)
    # vLLM extension: the last (assistant) message is a prefix the model continues.
    continue_final_message: bool = False

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = pydantic.Field(default=16, ge=1)  # OpenAI's default for completions

    @property
    def limit(self) -> int | None:
        return self.max_tokens


class EmbeddingRequest(_Base):
    model: str = pydantic.Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    dimensions: int | None = pydantic.Field(default=None, ge=1, le=8192)
    encoding_format: Literal["float", "base64"] = "float"


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of an embeddings `input`


def too_many_items(
    data: dict[str, Any], max_tokens: int, message_tokens: int = 1
) -> tuple[str, str, str] | None:
    """(message, code, param) when a parsed body holds more items than a request can use,
    checked before validation: validating is what costs (16 MiB of tiny chat messages, some
    580,000 of them, took pydantic ~2 s of CPU and ~260 MB, and the engine as much again
    after). A model of `max_tokens` context takes at most max_tokens / `message_tokens`
    messages (the fewest tokens an empty message takes in the engine's chat prompt), and
    max_tokens token ids, prompts or content parts (an empty part adds none: nobody needs
    more)."""
    msgs = data.get("messages")
    if isinstance(msgs, list):
        if len(msgs) * message_tokens > max_tokens:
            return (f"{len(msgs)} messages exceed the model's context of {max_tokens} tokens "
                    f"(each takes {message_tokens} or more)",
                    "context_length_exceeded", "messages")
        parts = sum(len(m["content"]) for m in msgs
                    if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > max_tokens:
            return (f"{parts} content parts: at most {max_tokens} in a request",
                    "invalid_value", "messages")
    for field, cap, code in (
            ("prompt", max_tokens, "context_length_exceeded"),
            ("input", min(max_tokens, MAX_EMBEDDING_INPUTS), "invalid_value")):
        items = data.get(field)
        if isinstance(items, list) and (len(items) > cap or any(
                isinstance(x, list) and len(x) > max_tokens for x in items)):
            return (f"{field}: more items than a request takes (at most {cap} entries, "
                    f"{max_tokens} token ids each)", code, field)
    return None


def error_body(
    message: str, type_: str = "invalid_request_error", code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_message(exc: pydantic.ValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request body", None
    first = errs[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return f"invalid request: {loc or 'body'}: {first.get('msg', 'invalid')}", loc or None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_completion(
    rid: str, created: int, model: str, text: str, finish: str, prompt: int, completion: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage(prompt, completion),
    }


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None,
    with_usage_field: bool,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def text_completion(
    rid: str, created: int, model: str, text: str, finish: str, prompt: int, completion: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": usage(prompt, completion),
    }


def text_chunk(
    rid: str, created: int, model: str, text: str, finish: str | None, with_usage_field: bool
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(
    rid: str, created: int, model: str, obj: str, prompt: int, completion: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt, completion),
    }


def embedding_item(index: int, vector: list[float], fmt: str) -> dict[str, Any]:
    data: Any = vector
    if fmt == "base64":
        data = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return {"object": "embedding", "index": index, "embedding": data}
