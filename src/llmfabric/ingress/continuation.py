"""Mid-stream continuation: a chat stream whose node dies or stalls after the first byte goes
on from another node, into the same client response.

While a chat stream is relayed, `RelayRecorder` keeps the bytes the client got (bounded) and
holds back any incomplete SSE event, so the client only ever sees whole events. When the
upstream fails, `plan_continuation` reads what was relayed: the text so far, the stream's id,
and whether it can be continued (one choice, no tool calls, not finished, under the byte
bound). The continuation request is the original one plus an assistant message holding that
text, with vLLM's `continue_final_message` (and `add_generation_prompt: false`), the token
limit reduced by what was relayed, and usage requested. `ContinuationRelay` passes its events
on with the original id and creation time, drops its opening role-only chunk, and merges
usage: completion tokens of both parts, and as prompt tokens the continuation's less the
relayed completion tokens: the original prompt plus the template tokens of the added assistant
message (a few, engine-specific), close to what an uninterrupted stream would have reported.

Legacy `/v1/completions` streams are continued the way a language model continues text: the
new prompt is the original one (a single string) plus the relayed text, with the same limit
cut and usage merge (the continuation's prompt less the relayed tokens is the original
prompt). `echo`, `suffix`, `best_of` and token-id or batched prompts are not continued.

Off per request with `metadata.continuation: false` (or IngressConfig.continue_streams);
other routes get the old behaviour: an error event, then the end of the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from llmfabric.accounts.policy import clamp_tokens
from llmfabric.ingress.attempt import AbandonIfDown
from llmfabric.ingress.config import IngressConfig, Timeouts
from llmfabric.ingress.errors import UpstreamError, error_body
from llmfabric.ingress.protocols import CandidateSource, CompletionHold, Forwarder, StreamSink
from llmfabric.ingress.tracing import current_trace
from llmfabric.ingress.usage import (
    MAX_SSE_LINE,
    Usage,
    claimed_tokens,
    estimate_prompt_tokens,
)
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.policies import Policy
from llmfabric.routing.request import RouteRequest
from llmfabric.routing.router import NoRoute, Router
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
CONTINUABLE_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})
MAX_RECORDED_BYTES = 4 * 1024 * 1024  # past this a stream is not continued (clean error)
_EVENT_END = b"\n\n"
MAX_ID_CHARS = 256  # a completion id kept for the continued stream


def continuation_wanted(doc: Mapping[str, Any], path: str, enabled: bool) -> bool:
    """Whether this streamed request gets continuation (before any byte is relayed)."""
    if not enabled or path not in CONTINUABLE_PATHS:
        return False
    meta = doc.get("metadata")
    if isinstance(meta, dict) and meta.get("continuation") in (False, "false", "off", "0"):
        return False
    n = doc.get("n", 1)
    if path == COMPLETIONS_PATH and _text_prompt(doc) is None:
        return False
    return n in (1, None)


def _text_prompt(doc: Mapping[str, Any]) -> str | None:
    """A completions request's prompt when its text can simply be extended: one string (or a
    list of one), no echo, suffix or best_of (the relayed text would not be the answer)."""
    if doc.get("echo") or doc.get("suffix") or doc.get("best_of") not in (None, 1):
        return None
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


class RelayRecorder:
    """The client-bound bytes of one stream, cut at whole SSE events. An incomplete tail is
    held as a list of chunks and each new chunk is searched alone (with the held tail's last
    byte, for an event end split across chunks): re-joining and searching everything held on
    every chunk cost 4 s of CPU for 1 MiB that never ended an event, in 64-byte frames."""

    __slots__ = ("_held", "_held_size", "_parts", "overflow", "size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._held: list[bytes] = []
        self._held_size = 0
        self.size = 0
        self.overflow = False

    def feed(self, data: bytes) -> bytes:
        """The bytes to send now (whole events); an incomplete tail waits for its end."""
        overlap = self._held[-1][-(len(_EVENT_END) - 1):] if self._held else b""
        window = overlap + data
        cut = window.rfind(_EVENT_END)
        if cut < 0:
            self._held.append(data)
            self._held_size += len(data)
            if self._held_size > MAX_RECORDED_BYTES:  # never an event: pass on, stop recording
                self.overflow = True
                return self.flush()
            return b""
        end = cut + len(_EVENT_END) - len(overlap)  # in `data`
        data, tail = b"".join([*self._held, data[:end]]), data[end:]
        self._held = [tail] if tail else []
        self._held_size = len(tail)
        if not self.overflow:
            self.size += len(data)
            if self.size > MAX_RECORDED_BYTES:
                self.overflow = True
                self._parts.clear()
            else:
                self._parts.append(data)
        return data

    def flush(self) -> bytes:
        """At a normal end: whatever was held back."""
        rest = b"".join(self._held)
        self._held, self._held_size = [], 0
        return rest

    def recorded(self) -> bytes:
        return b"".join(self._parts)


@dataclass(frozen=True, slots=True)
class Relayed:
    """What the client has of a chat stream."""

    text: str
    tokens: int  # content chunks relayed (one token each from vLLM and the sim engine)
    id: str
    created: int
    finished: bool  # a finish_reason, [DONE] or an error event was relayed
    blocked: str  # why it cannot be continued ("" if it can)


def read_relayed(data: bytes) -> Relayed:
    text: list[str] = []
    tokens = 0
    rid, created = "", 0
    finished = False
    blocked = ""
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            finished = True
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            blocked = "an event the ingress cannot read was relayed"
            continue
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            finished = True
        got_id = obj.get("id")
        if not rid and isinstance(got_id, str) and len(got_id) <= MAX_ID_CHARS:
            # (copied onto every event of the continuation: a 4 MiB id turned 20 KB of
            # continued stream into 804 MB for the client)
            rid = got_id
        created = created or _int(obj.get("created"))
        for ch in _choices(obj):
            if not isinstance(ch, dict):
                continue
            if ch.get("index", 0) != 0:
                blocked = "more than one choice"
            delta = ch.get("delta") or {}
            if isinstance(delta, dict):
                if delta.get("tool_calls"):
                    blocked = "tool calls were streamed"
                piece = delta.get("content", ch.get("text"))  # chat, else completions
                if isinstance(piece, str) and piece:
                    text.append(piece)
                    tokens += 1
            if ch.get("finish_reason") is not None:
                finished = True
    return Relayed("".join(text), tokens, rid, created, finished, blocked)


def plan_continuation(doc: Mapping[str, Any], recorder: RelayRecorder, path: str = CHAT_PATH
                      ) -> tuple[Relayed, dict[str, Any] | None, str]:
    """(what was relayed, the continuation request body or None, why not)."""
    if recorder.overflow:
        return Relayed("", 0, "", 0, False, "too long"), None, (
            f"more than {MAX_RECORDED_BYTES} bytes were relayed")
    got = read_relayed(recorder.recorded())
    if got.blocked:
        return got, None, got.blocked
    if got.finished:
        return got, None, "the stream had ended"
    body: dict[str, Any] = {**doc, "stream": True, "stream_options": {"include_usage": True}}
    if path == COMPLETIONS_PATH:
        prompt = _text_prompt(doc)
        if prompt is None:
            return got, None, "the prompt is not one text"
        body["prompt"] = prompt + got.text
    else:
        msgs = doc.get("messages")
        if not isinstance(msgs, list):
            return got, None, "no messages"
        body.update(messages=[*msgs, {"role": "assistant", "content": got.text}],
                    continue_final_message=True, add_generation_prompt=False)
    for key in ("max_tokens", "max_completion_tokens"):
        limit = doc.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - got.tokens < 1:
                return got, None, "the token limit was reached"
            body[key] = limit - got.tokens
    return got, body, ""


def _int(v: Any) -> int:
    """A provider's integer field (`created`), 0 when it is not a plausible one."""
    return v if type(v) is int and 0 <= v < 1 << 53 else 0


def _choices(obj: Mapping[str, Any]) -> list[Any]:
    choices = obj.get("choices")
    return choices if isinstance(choices, list) else []


class ContinuationRelay:
    """Re-shapes the continuation's SSE events into the client's stream. The continuing
    node is as untrusted as the first: a line longer than `max_line` bytes ends the attempt
    (`UpstreamError`), fields of the wrong type are skipped, usage is clamped."""

    def __init__(self, first: Relayed, want_usage_chunk: bool,
                 max_line: int = MAX_SSE_LINE) -> None:
        self.first = first
        self.want_usage_chunk = want_usage_chunk
        self.max_line = max_line
        self._carry = b""
        self._opened = False
        self.usage: tuple[int, int] | None = None  # merged (prompt, completion)
        self.tokens = 0  # content chunks of the continuation
        self.text: list[str] = []
        self.finished = False
        self.done = False
        self.first_out_at = 0.0  # perf_counter() of the first bytes written to the client

    def feed(self, data: bytes) -> bytes:
        if len(self._carry) + len(data) > self.max_line and b"\n" not in data:
            raise UpstreamError(f"the continuing node sent an SSE line over {self.max_line} "
                                "bytes")
        data = self._carry + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._carry = data
            return b""
        self._carry = data[cut + 1:]
        if len(self._carry) > self.max_line:
            raise UpstreamError(f"the continuing node sent an SSE line over {self.max_line} "
                                "bytes")
        out: list[bytes] = []
        for line in data[:cut].split(b"\n"):
            event = self._line(line)
            if event:
                out.append(event)
        return b"".join(out)

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return b""
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return b"data: [DONE]\n\n"
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(obj, dict):
            return b""
        if self.first.id:
            obj["id"] = self.first.id
        if self.first.created:
            obj["created"] = self.first.created
        usage = obj.get("usage")
        choices = _choices(obj)
        if isinstance(usage, dict) and not choices:
            prompt, comp = claimed_tokens(usage) or (0, 0)  # (clamped: the provider's claim)
            merged = (max(0, prompt - self.first.tokens),
                      clamp_tokens(comp + self.first.tokens))
            self.usage = merged
            if not self.want_usage_chunk:
                return b""
            obj["usage"] = {**usage, "prompt_tokens": merged[0],
                            "completion_tokens": merged[1],
                            "total_tokens": merged[0] + merged[1]}
            return b"data: " + orjson.dumps(obj) + b"\n\n"
        if not self.want_usage_chunk and "usage" in obj:
            del obj["usage"]
        for ch in choices:
            if not isinstance(ch, dict):
                continue
            delta = ch.get("delta")
            if isinstance(delta, dict):
                if not self._opened and "role" in delta and not delta.get("content"):
                    self._opened = True
                    if ch.get("finish_reason") is None:
                        return b""  # the client had its role chunk from the first node
                delta.pop("role", None)
                piece = delta.get("content")
            else:  # a completions choice
                piece = ch.get("text")
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                self.tokens += 1
            if ch.get("finish_reason") is not None:
                self.finished = True
        self._opened = True
        return b"data: " + orjson.dumps(obj) + b"\n\n"


class ResumeHost(Protocol):
    """What the continuation loop needs of the ingress (app.Ingress)."""

    router: Router
    forwarder: Forwarder
    policy: Policy
    config: IngressConfig
    source: CandidateSource


async def resume_stream(
    host: ResumeHost, sink: StreamSink, recorder: RelayRecorder, doc: Mapping[str, Any],
    rreq: RouteRequest, candidates: Sequence[Candidate], tried: list[str], path: str,
    want_usage_chunk: bool, timeouts: Timeouts, bound: CompletionHold | None = None,
) -> tuple[tuple[int, int] | None, Candidate | None, str]:
    """Continue a failed chat or completions stream on other candidates until one finishes it.
    `bound`: an uncapped request's completion hold (a node of a larger context continues
    it capped at what is left of it).

    Returns (merged usage or None, the candidate that finished, "") or (None, None, why not);
    on failure the caller writes the error event and ends the stream."""
    why = ""
    t_cut = time.perf_counter()
    for _ in range(1 + host.config.max_retries):
        first, body, why_not = plan_continuation(doc, recorder, path)
        if body is None:
            return None, None, why_not
        decision = host.router.route(rreq, candidates, tried, len(tried))
        if isinstance(decision, NoRoute):
            return None, None, why or "no other node can continue it"
        cand = decision.candidate
        if bound is not None and bound.binds(cand):  # (what is left of the held cap)
            first, body, why_not = plan_continuation(bound.capped(doc), recorder, path)
            if body is None:
                return None, None, why_not
        tried.append(cand.session_id)
        send = orjson.dumps({**body, "model": cand.model.engine_name(rreq.model)})
        relay = ContinuationRelay(first, want_usage_chunk, host.config.max_sse_line_bytes)
        host.policy.on_request_start(cand)
        tr = current_trace()  # each continuation is an attempt span; its node joins the trace
        if tr is not None:
            tr.open_attempt(cand.session_id, model=rreq.model, continuation=True)
        ok = False
        try:
            ok = await _relay_from(host, sink, recorder, relay, cand, path, send, timeouts)
        except (aiohttp.ClientError, TimeoutError, UpstreamError, OSError) as e:
            why = f"node {cand.session_id} failed: {e!r}"
            log.warning("stream continuation on %s failed: %r", cand.session_id, e)
        finally:
            host.policy.on_request_end(cand, ok)
            if tr is not None:
                tr.close_attempt(200 if ok else None, "" if ok else why)
        if ok:
            log.warning("a stream cut after %d tokens continued on node %s (%s): next "
                        "bytes %.0f ms after the cut", first.tokens, cand.session_id,
                        why_cut(tried), (relay.first_out_at - t_cut) * 1000)
            return relay.usage, cand, ""
    return None, None, why


def why_cut(tried: Sequence[str]) -> str:
    return f"tried {', '.join(t[:8] for t in tried)}"


async def _relay_from(host: ResumeHost, sink: StreamSink, recorder: RelayRecorder,
                      relay: ContinuationRelay, cand: Candidate, path: str, body: bytes,
                      t: Timeouts) -> bool:
    async with asyncio.timeout(t.first_byte):
        with AbandonIfDown(host.source, cand):  # (a node doubted before it answers: next)
            up = await host.forwarder.open(cand, path, body, t)
    if (tr := current_trace()) is not None:
        tr.upstream(up.hop)
        tr.first_byte()
    try:
        if up.status != 200:
            raise UpstreamError(f"node {cand.session_id} answered {up.status}")
        async with asyncio.timeout(t.total):
            async for chunk in up.chunks():
                out = relay.feed(chunk)
                if out:
                    out = recorder.feed(out)
                    if out:
                        if not relay.first_out_at:
                            relay.first_out_at = time.perf_counter()
                        await sink.write(out)
    finally:
        await up.aclose()
    if not relay.finished:
        raise UpstreamError(f"node {cand.session_id} ended the stream early")
    if not relay.done:
        await sink.write(recorder.feed(b"data: [DONE]\n\n"))
    return True


_CLIENT_GONE = (ConnectionResetError, ConnectionError)


async def continue_stream(
    host: ResumeHost, sink: StreamSink, recorder: RelayRecorder, doc: Mapping[str, Any],
    rreq: RouteRequest, candidates: Sequence[Candidate], tried: list[str], path: str,
    want_usage_chunk: bool, failed: Candidate, why: str,
    bound: CompletionHold | None = None,
) -> tuple[Usage, Candidate]:
    """Continue a stream whose node failed after the first byte and end it; when no node can,
    end it with an error event as before. Returns the usage to bill and who served last."""
    try:
        got, by, why_not = await resume_stream(host, sink, recorder, doc, rreq, candidates,
                                               tried, path, want_usage_chunk,
                                               host.config.timeouts, bound)
        if by is None:
            msg = f"{why}; not continued: {why_not}"
            await sink.write(b"data: " + error_body(502, msg, "upstream_failed") + b"\n\n")
        await sink.end()
    except _CLIENT_GONE:
        got, by = None, None
    if got is not None:
        return Usage(*got), by or failed
    relayed = read_relayed(recorder.recorded())  # bill what was relayed, estimated
    return Usage(estimate_prompt_tokens(dict(doc)), relayed.tokens, True), by or failed
