"""OpenAI Responses API (`POST /v1/responses`) over chat completions.

Stateless by design (`store=false` semantics): the fabric keeps no conversation state, since
a follow-up may land on any node of any provider. `previous_response_id`, `conversation` and
`background` are refused with 400; clients send the whole input each time (as with
`store=false` on OpenAI). Every response says `"store": false`.

`responses_to_chat` maps a Responses request to a chat completions body (instructions,
input items incl. function calls and their outputs, tools, tool_choice, `text.format` ->
`response_format`, max_output_tokens, temperature, top_p, seed, stop, logprobs, the fallback
`models`);
`chat_to_response` maps the chat reply back; `ResponsesStream` re-shapes a streamed chat
completion into the Responses event stream (response.created ... response.completed).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from llmfabric.apis.chat_stream import ChatStreamTranslator, Sink
from llmfabric.ingress.usage import claimed_tokens


class TranslationError(ValueError):
    """A request the translated API refuses (400); `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_request") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


LOGPROBS_INCLUDE = "message.output_text.logprobs"
_UNSUPPORTED = {
    "previous_response_id": "this fabric is stateless (store=false semantics): send the "
                            "whole conversation in 'input' instead of previous_response_id",
    "conversation": "this fabric is stateless (store=false semantics): conversations are not "
                    "stored; send the whole conversation in 'input'",
    "background": "background responses need stored state; this fabric is stateless",
}
_PASS = ("temperature", "top_p", "seed", "stop", "user", "parallel_tool_calls",
         "metadata", "frequency_penalty", "presence_penalty")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _text_of(content: Any, param: str) -> str | list[dict[str, Any]]:
    """Responses message content -> chat content (a string, or parts with images)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError("message content must be a string or a list of parts", param)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise TranslationError("a content part must be an object", f"{param}[{i}]")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise TranslationError("a text part needs 'text' (a string)", f"{param}[{i}]")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise TranslationError("input_image needs 'image_url' (file ids are not "
                                       "supported)", f"{param}[{i}]")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise TranslationError(f"content part type {kind!r} is not supported",
                                   f"{param}[{i}].type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise TranslationError("'instructions' must be a string", "instructions")
        msgs.append({"role": "system", "content": instructions})
    inp = doc.get("input")
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
        return msgs
    if not isinstance(inp, list) or not inp:
        raise TranslationError("'input' is required: a string or a non-empty list of items",
                               "input")
    for i, item in enumerate(inp):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise TranslationError("an input item must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise TranslationError("role must be user, assistant, system or developer",
                                       f"{where}.role")
            msgs.append({"role": role, "content": _text_of(item.get("content"),
                                                           f"{where}.content")})
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "")
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(name, str) or not isinstance(args, str) or \
                    not isinstance(call_id, str):
                raise TranslationError("function_call needs call_id, name and arguments "
                                       "(strings)", where)
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one assistant turn
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise TranslationError("function_call_output needs call_id", where)
            if not isinstance(output, str):
                output = _text_of(output, f"{where}.output")
                if not isinstance(output, str):
                    raise TranslationError("function_call_output must be text", where)
            msgs.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue  # a replayed output item: chat engines take no reasoning input
        else:
            raise TranslationError(f"input item type {kind!r} is not supported", where)
    return msgs


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise TranslationError("'tools' must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or \
                not isinstance(t.get("name"), str):
            raise TranslationError("only function tools (with a name) are supported",
                                   f"tools[{i}]")
        fn: dict[str, Any] = {"name": t["name"]}
        for k in ("description", "parameters", "strict"):
            if t.get(k) is not None:
                fn[k] = t[k]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc: Any) -> Any:
    if tc in ("auto", "none", "required"):
        return tc
    if isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    raise TranslationError("tool_choice must be auto, none, required or a function",
                           "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise TranslationError("'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise TranslationError("'text.format' must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
            raise TranslationError("json_schema format needs 'name' and 'schema'",
                                   "text.format")
        js = {k: fmt[k] for k in ("name", "schema", "strict", "description")
              if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": js}
    raise TranslationError(f"text.format type {kind!r} is not supported", "text.format.type")


def refuse_stateful(doc: dict[str, Any]) -> None:
    """Raise for the fields that need server-side state (refused on every path)."""
    for key, why in _UNSUPPORTED.items():
        if doc.get(key) not in (None, False):
            raise TranslationError(why, key, "unsupported_parameter")


def responses_to_chat(doc: dict[str, Any]) -> dict[str, Any]:
    """A Responses create request -> a chat completions request (TranslationError -> 400)."""
    refuse_stateful(doc)
    model = doc.get("model")
    models = doc.get("models")  # fallback models (validated by the core, request_body.py)
    if (not isinstance(model, str) or not model) and (model is not None or models is None):
        raise TranslationError("'model' is required (a string)", "model", "missing_model")
    if doc.get("n") not in (None, 1):
        raise TranslationError("the Responses API returns one output; n must be 1", "n")
    chat: dict[str, Any] = {"messages": _messages(doc)}
    if model is not None:
        chat["model"] = model
    if models is not None:
        chat["models"] = models
    for k in _PASS:
        if doc.get(k) is not None:
            chat[k] = doc[k]
    mot = doc.get("max_output_tokens")
    if mot is not None:
        if not isinstance(mot, int) or isinstance(mot, bool) or mot < 1:
            raise TranslationError("'max_output_tokens' must be a positive integer",
                                   "max_output_tokens")
        chat["max_tokens"] = mot
    if doc.get("tools"):
        chat["tools"] = _tools(doc["tools"])
    if doc.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(doc["tool_choice"])
    if doc.get("text") is not None:
        rf = _response_format(doc["text"])
        if rf is not None:
            chat["response_format"] = rf
    include = doc.get("include")
    if include is not None and not isinstance(include, list):
        raise TranslationError("'include' must be a list", "include")
    top = doc.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool)
                            or not 0 <= top <= 20):
        raise TranslationError("'top_logprobs' must be an integer in [0, 20]", "top_logprobs")
    if top is not None or (include and LOGPROBS_INCLUDE in include):
        chat["logprobs"] = True
        if top:
            chat["top_logprobs"] = top
    if doc.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _usage(u: tuple[int, int] | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {"input_tokens": u[0], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u[1], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u[0] + u[1]}


def response_shell(req: dict[str, Any], rid: str, model: str, created: int,
                   status: str) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    text = req.get("text") if isinstance(req.get("text"), dict) else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "error": None, "incomplete_details": None, "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"), "model": model, "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": None, "reasoning": None, "store": False,
        "temperature": req.get("temperature"), "top_p": req.get("top_p"),
        "text": text or {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice", "auto"), "tools": req.get("tools") or [],
        "truncation": "disabled", "usage": None, "user": req.get("user"),
        "metadata": req.get("metadata") or {},
    }


def _finish(out: dict[str, Any], finish: str | None) -> None:
    if finish == "length":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "content_filter"}
    else:
        out["status"] = "completed"


def message_item(mid: str, text: str, logprobs: list[Any] | None, status: str
                 ) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [part]}


def chat_to_response(chat: Any, req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion body -> a Response object (ValueError if it is not one)."""
    if not isinstance(chat, dict) or not isinstance(chat.get("choices"), list) \
            or not chat["choices"] or not isinstance(chat["choices"][0], dict):
        raise ValueError("the engine's reply is not a chat completion")
    choice: dict[str, Any] = chat["choices"][0]
    msg = _dict(choice.get("message"))
    created = chat.get("created")
    if not isinstance(created, int):
        created = int(time.time())
    out = response_shell(req, new_id("resp"), str(chat.get("model") or req.get("model")),
                         created, "completed")
    items: list[dict[str, Any]] = []
    content = msg.get("content")
    lp = choice.get("logprobs")
    lps = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, str) and (content or not msg.get("tool_calls")):
        items.append(message_item(new_id("msg"), content,
                                  lps if isinstance(lps, list) else None, "completed"))
    for tc in _list_of(msg.get("tool_calls")):
        if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
            continue
        fn = tc["function"]
        items.append({"type": "function_call", "id": new_id("fc"),
                      "call_id": str(tc.get("id") or new_id("call")),
                      "name": str(fn.get("name", "")),
                      "arguments": str(fn.get("arguments", "")), "status": "completed"})
    out["output"] = items
    _finish(out, choice.get("finish_reason"))
    u = claimed_tokens(chat.get("usage"))  # (clamped: the engine's claim)
    if u is not None:
        out["usage"] = _usage(u)
    return out


class ResponsesStream(ChatStreamTranslator):
    """Chat chunks in, the Responses API's event stream out."""

    def __init__(self, inner: Sink, req: dict[str, Any], max_line: int) -> None:
        super().__init__(inner, max_line)
        self.req = req
        self.rid = new_id("resp")
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.msg: dict[str, Any] | None = None  # the open message item
        self.text: list[str] = []
        self.logprobs: list[Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool index -> function_call item

    def _ev(self, kind: str, **fields: Any) -> None:
        self.emit(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1

    def _shell(self, status: str) -> dict[str, Any]:
        return response_shell(self.req, self.rid, self.model or str(self.req.get("model")),
                              self.created, status)

    def on_start(self) -> None:
        self._ev("response.created", response=self._shell("in_progress"))
        self._ev("response.in_progress", response=self._shell("in_progress"))

    def on_text(self, text: str, logprobs: list[Any] | None) -> None:
        if self.msg is None:
            self.msg = message_item(new_id("msg"), "", None, "in_progress")
            self.msg["content"] = []
            self.items.append(self.msg)
            idx = len(self.items) - 1
            self._ev("response.output_item.added", output_index=idx, item=self.msg)
            self._ev("response.content_part.added", item_id=self.msg["id"], output_index=idx,
                     content_index=0, part={"type": "output_text", "text": "",
                                            "annotations": []})
        self.text.append(text)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
        self._ev("response.output_text.delta", item_id=self.msg["id"],
                 output_index=self.items.index(self.msg), content_index=0, delta=text,
                 logprobs=logprobs or [])

    def on_tool_call(self, index: int, call_id: str | None, name: str | None,
                     arguments: str) -> None:
        self._close_message()
        item = self.calls.get(index)
        if item is None:
            item = {"type": "function_call", "id": new_id("fc"),
                    "call_id": call_id or new_id("call"), "name": name or "",
                    "arguments": "", "status": "in_progress"}
            self.calls[index] = item
            self.items.append(item)
            self._ev("response.output_item.added", output_index=len(self.items) - 1,
                     item=dict(item))
        if arguments:
            item["arguments"] += arguments
            self._ev("response.function_call_arguments.delta", item_id=item["id"],
                     output_index=self.items.index(item), delta=arguments)

    def _close_message(self) -> None:
        m = self.msg
        if m is None or m["status"] == "completed":
            return
        idx = self.items.index(m)
        text = "".join(self.text)
        done = message_item(m["id"], text, self.logprobs, "completed")
        m.update(done)
        part = done["content"][0]
        self._ev("response.output_text.done", item_id=m["id"], output_index=idx,
                 content_index=0, text=text, logprobs=self.logprobs or [])
        self._ev("response.content_part.done", item_id=m["id"], output_index=idx,
                 content_index=0, part=part)
        self._ev("response.output_item.done", output_index=idx, item=m)

    def on_finish(self) -> None:
        self._close_message()
        for item in self.calls.values():
            item["status"] = "completed"
            idx = self.items.index(item)
            self._ev("response.function_call_arguments.done", item_id=item["id"],
                     output_index=idx, arguments=item["arguments"])
            self._ev("response.output_item.done", output_index=idx, item=item)
        out = self._shell("completed")
        out["output"] = self.items
        _finish(out, self.finish_reason)
        out["usage"] = _usage(self.usage)
        kind = "response.completed" if out["status"] == "completed" else "response.incomplete"
        self._ev(kind, response=out)

    def on_error(self, code: str, message: str) -> None:
        out = self._shell("failed")
        out["output"] = self.items
        out["error"] = {"code": "server_error", "message": message}
        self._ev("response.failed", response=out)


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list_of(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []
