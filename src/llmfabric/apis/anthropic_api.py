"""Anthropic Messages API (`POST /v1/messages`) over chat completions.

`messages_to_chat` maps a Messages request (system prompt, content blocks incl. images,
tool_use / tool_result, tools, tool_choice, stop_sequences, max_tokens, temperature, top_p,
top_k) to a chat completions body; `chat_to_message` maps the reply back (stop_reason from
finish_reason, usage as input/output tokens; `fallbacks: [{"model": ...}]` becomes the
core's `models`, `fallback_models`); `MessagesStream` re-shapes a streamed chat
completion into Anthropic's events (message_start, content_block_start/delta/stop,
message_delta with usage, message_stop). `anthropic_error` gives Anthropic's error shape.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmfabric.apis.chat_stream import ChatStreamTranslator, Sink
from llmfabric.apis.responses_api import TranslationError, new_id
from llmfabric.ingress.request_body import MAX_ENTRIES, MAX_FALLBACKS
from llmfabric.ingress.usage import claimed_tokens

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "function_call": "tool_use", "content_filter": "refusal"}


def anthropic_error(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _blocks(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    """One Anthropic message -> chat messages (tool results become their own messages)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise TranslationError("content must be a string or a list of blocks", where)
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for i, b in enumerate(content):
        at = f"{where}[{i}]"
        if not isinstance(b, dict):
            raise TranslationError("a content block must be an object", at)
        kind = b.get("type")
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise TranslationError("a text block needs 'text' (a string)", at)
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            src = b.get("source")
            if not isinstance(src, dict):
                raise TranslationError("an image block needs a 'source'", at)
            if src.get("type") == "base64" and isinstance(src.get("data"), str):
                url = f"data:{src.get('media_type', 'image/png')};base64,{src['data']}"
            elif src.get("type") == "url" and isinstance(src.get("url"), str):
                url = src["url"]
            else:
                raise TranslationError("image source must be base64 or url", at)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise TranslationError("tool_use needs 'id' and 'name'", at)
            calls.append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": orjson.dumps(b.get("input", {})).decode()}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise TranslationError("tool_result needs 'tool_use_id'", at)
            res = b.get("content", "")
            text = res if isinstance(res, str) else _texts(_list(res, at), f"{at}.content")
            if b.get("is_error") is True:
                text = "error: " + text
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # not replayed to a chat engine
        else:
            raise TranslationError(f"content block type {kind!r} is not supported here",
                                   f"{at}.type")
    out: list[dict[str, Any]] = list(tools)
    if parts or calls:
        msg: dict[str, Any] = {"role": role}
        if all(p["type"] == "text" for p in parts):
            msg["content"] = "".join(p["text"] for p in parts) if parts else None
        else:
            msg["content"] = parts
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _texts(blocks: list[Any], where: str) -> str:
    """The text of a list of text blocks (a system prompt, a tool result); blocks of other
    types are skipped, a text that is not a string is refused."""
    out = []
    for i, x in enumerate(blocks):
        if not isinstance(x, dict) or x.get("type", "text") != "text":
            continue
        text = x.get("text", "")
        if not isinstance(text, str):
            raise TranslationError("a text block's 'text' must be a string", f"{where}[{i}]")
        out.append(text)
    return "".join(out)


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise TranslationError("expected a list", where)
    return v


def messages_to_chat(doc: dict[str, Any]) -> dict[str, Any]:
    """A Messages request -> a chat completions request (TranslationError -> 400)."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError("model: field required (a string)", "model")
    models = fallback_models(doc)
    mt = doc.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        raise TranslationError("max_tokens: field required (a positive integer)", "max_tokens")
    msgs: list[dict[str, Any]] = []
    system = doc.get("system")
    if isinstance(system, list):
        system = _texts(system, "system")
    if system is not None:
        if not isinstance(system, str):
            raise TranslationError("system must be a string or text blocks", "system")
        msgs.append({"role": "system", "content": system})
    for i, m in enumerate(_list(doc.get("messages"), "messages")):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise TranslationError("each message needs role user or assistant",
                                   f"messages[{i}]")
        msgs.extend(_blocks(m.get("content"), m["role"], f"messages[{i}].content"))
    if len(msgs) == (1 if system is not None else 0):
        raise TranslationError("messages: at least one message is required", "messages")
    chat: dict[str, Any] = {"model": model, "messages": msgs, "max_tokens": mt}
    if models is not None:
        chat["models"] = models  # (validated by the request core, request_body.py)
    for k in ("temperature", "top_p", "top_k"):
        if doc.get(k) is not None:
            chat[k] = doc[k]
    stops = doc.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise TranslationError("stop_sequences must be a list of strings",
                                   "stop_sequences")
        chat["stop"] = stops
    meta = doc.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("user_id"), str):
        chat["user"] = meta["user_id"]
    tools = doc.get("tools")
    if tools:
        out = []
        for i, t in enumerate(_list(tools, "tools")):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise TranslationError("a tool needs a 'name'", f"tools[{i}]")
            fn: dict[str, Any] = {"name": t["name"],
                                  "parameters": t.get("input_schema") or {"type": "object"}}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            out.append({"type": "function", "function": fn})
        chat["tools"] = out
    tc = doc.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        if kind == "tool" and isinstance(tc.get("name"), str):
            chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
        elif kind in ("auto", "none"):
            chat["tool_choice"] = kind
        elif kind == "any":
            chat["tool_choice"] = "required"
        else:
            raise TranslationError("tool_choice type must be auto, any, tool or none",
                                   "tool_choice")
        if tc.get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False
    if doc.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def fallback_models(doc: dict[str, Any]) -> Any:
    """The request's fallback models for the core's `models` (None: none): Anthropic's
    `fallbacks: [{"model": ...}]` (no per-entry overrides here: only `model`), or `models`
    as on the OpenAI routes; not both."""
    fallbacks = doc.get("fallbacks")
    if fallbacks is None:
        return doc.get("models")
    if doc.get("models") is not None:
        raise TranslationError("send fallback models in 'fallbacks' or 'models', not both",
                               "fallbacks", "invalid_models")
    if not isinstance(fallbacks, list):
        raise TranslationError("fallbacks must be a list of {\"model\": ...} objects",
                               "fallbacks", "invalid_models")
    if len(fallbacks) > MAX_ENTRIES:  # (a long list is refused unread)
        raise TranslationError(f"fallbacks lists at most {MAX_FALLBACKS} models",
                               "fallbacks", "invalid_models")
    out = []
    for i, entry in enumerate(fallbacks):
        if not isinstance(entry, dict) or set(entry) != {"model"}:
            raise TranslationError("a fallback is {\"model\": NAME}: per-fallback overrides "
                                   "(max_tokens, thinking, ...) are not supported",
                                   f"fallbacks[{i}]", "invalid_models")
        out.append(entry["model"])
    return out


def stop_reason(finish: str | None, matched: Any, stops: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from a chat finish_reason (+ vLLM's matched stop)."""
    if not isinstance(finish, str):
        finish = None
    if finish == "stop" and isinstance(matched, str) and isinstance(stops, list) \
            and matched in stops:
        return "stop_sequence", matched
    return _STOP.get(finish or "stop", "end_turn"), None


def _args(s: str) -> Any:
    try:
        v = orjson.loads(s) if s else {}
    except orjson.JSONDecodeError:
        return {"_raw": s}
    return v if isinstance(v, dict) else {"_value": v}


def chat_to_message(chat: Any, req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion body -> an Anthropic Message (ValueError if it is not one)."""
    if not isinstance(chat, dict) or not isinstance(chat.get("choices"), list) \
            or not chat["choices"] or not isinstance(chat["choices"][0], dict):
        raise ValueError("the engine's reply is not a chat completion")
    choice: dict[str, Any] = chat["choices"][0]
    msg = _dict(choice.get("message"))
    content: list[dict[str, Any]] = []
    if isinstance(msg.get("content"), str) and msg["content"]:
        content.append({"type": "text", "text": msg["content"]})
    for tc in _list_of(msg.get("tool_calls")):
        if isinstance(tc, dict) and isinstance(tc.get("function"), dict):
            fn = tc["function"]
            content.append({"type": "tool_use", "id": str(tc.get("id") or new_id("toolu")),
                            "name": str(fn.get("name", "")),
                            "input": _args(str(fn.get("arguments", "")))})
    reason, seq = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                              req.get("stop_sequences"))
    p, c = claimed_tokens(chat.get("usage")) or (0, 0)  # (clamped: the engine's claim)
    return {"id": new_id("msg"), "type": "message", "role": "assistant",
            "model": str(chat.get("model") or req.get("model")), "content": content,
            "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": p, "output_tokens": c}}


class MessagesStream(ChatStreamTranslator):
    """Chat chunks in, Anthropic's Messages event stream out."""

    def __init__(self, inner: Sink, req: dict[str, Any], max_line: int) -> None:
        super().__init__(inner, max_line)
        self.req = req
        self.block = -1  # index of the open content block (-1: none yet)
        self.block_kind = ""
        self.tool_blocks: dict[int, int] = {}  # chat tool index -> block index

    def on_start(self) -> None:
        self.emit("message_start", {"type": "message_start", "message": {
            "id": new_id("msg"), "type": "message", "role": "assistant",
            "model": self.model or str(self.req.get("model")), "content": [],
            "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def _open(self, kind: str, block: dict[str, Any]) -> None:
        self._close()
        self.block += 1
        self.block_kind = kind
        self.emit("content_block_start", {"type": "content_block_start", "index": self.block,
                                          "content_block": block})

    def _close(self) -> None:
        if self.block_kind:
            self.emit("content_block_stop", {"type": "content_block_stop",
                                             "index": self.block})
            self.block_kind = ""

    def on_text(self, text: str, logprobs: list[Any] | None) -> None:
        if self.block_kind != "text":
            self._open("text", {"type": "text", "text": ""})
        self.emit("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                          "delta": {"type": "text_delta", "text": text}})

    def on_tool_call(self, index: int, call_id: str | None, name: str | None,
                     arguments: str) -> None:
        if index not in self.tool_blocks:
            self._open("tool_use", {"type": "tool_use", "id": call_id or new_id("toolu"),
                                    "name": name or "", "input": {}})
            self.tool_blocks[index] = self.block
        if arguments:
            self.emit("content_block_delta", {
                "type": "content_block_delta", "index": self.tool_blocks[index],
                "delta": {"type": "input_json_delta", "partial_json": arguments}})

    def on_finish(self) -> None:
        self._close()
        reason, seq = stop_reason(self.finish_reason, self.stop_reason,
                                  self.req.get("stop_sequences"))
        p, c = self.usage if self.usage is not None else (0, 0)
        self.emit("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                                    "usage": {"input_tokens": p, "output_tokens": c}})
        self.emit("message_stop", {"type": "message_stop"})

    def on_error(self, code: str, message: str) -> None:
        self.emit("error", {"type": "error", "error": {"type": "api_error",
                                                       "message": message}})


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list_of(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
