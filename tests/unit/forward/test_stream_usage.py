"""The node counts a stream's tokens when its engine sends no usage (forward/stream_usage.py):
a fake engine with a tokenize route behind the node's real EngineProxy."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.agent.engines import KINDS, EngineKind
from llmfabric.agent.tokenize import EngineTokenizer, token_count
from llmfabric.forward.engine_proxy import EngineProxy
from llmfabric.forward.stream_usage import (
    CHAT_MESSAGE_OVERHEAD,
    StreamTally,
    StreamUsageCounter,
)
from llmfabric.ingress.usage import StreamUsageScanner, estimate_prompt_tokens
from llmfabric.testing.poll import wait_until

WORDS = ["alpha", " beta", "", " gamma", " delta"]  # "" : a token whose text is held back


def sse(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def completion_events(words: list[str]) -> list[bytes]:
    out = [sse({"object": "text_completion", "choices": [
        {"index": 0, "text": w, "finish_reason": None}]}) for w in words]
    out.append(sse({"object": "text_completion", "choices": [
        {"index": 0, "text": "", "finish_reason": "length"}]}))
    return out


def chat_events(words: list[str]) -> list[bytes]:
    out = [sse({"choices": [{"index": 0, "delta": {"role": "assistant"},
                             "finish_reason": None}]})]
    out += [sse({"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]})
            for w in words]
    out.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return out


class FakeEngine:
    """Streams one event per word without usage (llama-cpp-python's shape); counts tokens as
    whitespace-separated words + 1 (a BOS) on its tokenize routes."""

    def __init__(self) -> None:
        self.tokenize_calls: list[tuple[str, Any]] = []
        self.tokenize_mode = "ok"  # ok | fail | garbage | slow | held
        self.release = asyncio.Event()
        self.tokenizing = asyncio.Event()
        self.streams_running = 0
        self.calls_during_stream = 0
        self.arrivals: list[str] = []
        self.with_usage = False
        self.break_after_done = False
        self.break_early = False
        self.open_after_done = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/extras/tokenize/count", self.tokenize)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        self.arrivals.append("generate")
        chat = request.path.endswith("/chat/completions")
        events = chat_events(WORDS) if chat else completion_events(WORDS)
        if not doc.get("stream"):
            return web.json_response({"choices": [{"text": "x"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.streams_running += 1
        try:
            for ev in events:
                # Split events mid-line: the relay must stay line-aligned.
                await resp.write(ev[:7])
                await resp.write(ev[7:])
                if doc.get("slow"):
                    await asyncio.sleep(0.05)
            if self.with_usage:
                await resp.write(sse({"choices": [], "usage": {
                    "prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}}))
            if self.break_early:
                assert request.transport is not None
                request.transport.close()  # broken before the end: no [DONE]
                return resp
            await resp.write(b"data: [DO")
            await resp.write(b"NE]\n\n")
            if self.open_after_done:  # the body never ends after [DONE]
                await asyncio.sleep(3600)
            if self.break_after_done:  # llama-cpp-python after an interrupt
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.close()
        finally:
            self.streams_running -= 1
        return resp

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        self.arrivals.append("tokenize")
        self.tokenize_calls.append((request.path, doc))
        if self.streams_running:
            self.calls_during_stream += 1
        if self.tokenize_mode == "fail":
            return web.json_response({"error": "nope"}, status=500)
        if self.tokenize_mode == "garbage":
            return web.Response(body=b'{"count": -3}', content_type="application/json")
        if self.tokenize_mode == "slow":
            await asyncio.sleep(5)
        if self.tokenize_mode == "held":
            self.tokenizing.set()
            await self.release.wait()
        text = doc.get("input", doc.get("content", ""))
        n = len(text.split()) + 1
        if request.path == "/tokenize":
            return web.json_response({"tokens": list(range(n))})
        return web.json_response({"count": n})


class Node:
    def __init__(self, engine: FakeEngine, kind: EngineKind, timeout_s: float = 2.0) -> None:
        self.engine, self.kind, self.timeout_s = engine, kind, timeout_s

    async def __aenter__(self) -> Node:
        self.server = TestServer(self.engine.app())
        await self.server.start_server()
        base = str(self.server.make_url("")).rstrip("/")
        self.tokenizer = EngineTokenizer(self.kind, base, lambda: self.proxy.session(),
                                         timeout_s=self.timeout_s)
        self.counter = StreamUsageCounter(self.kind, self.tokenizer)
        self.proxy = EngineProxy(base, around=self.counter.open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.proxy.aclose()
        await self.server.close()

    async def stream(self, path: str, doc: dict[str, Any]) -> bytes:
        up = await self.proxy.open(path, orjson.dumps(doc))
        try:
            return b"".join([c async for c in up.chunks()])
        finally:
            await up.aclose()


def events(data: bytes) -> list[Any]:
    return [orjson.loads(line[6:]) for line in data.split(b"\n\n")
            if line.startswith(b"data: {")]


LLAMA_PY = KINDS["llama-cpp-python"]
PROMPT = {"model": "tiny", "prompt": "one two three four", "stream": True,
          "stream_options": {"include_usage": True}}
CHAT = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi there you"}]}]}


async def test_a_stream_without_usage_gets_the_engines_count_marked_estimated() -> None:
    async with Node(FakeEngine(), LLAMA_PY) as node:
        out = await node.stream("/v1/completions", PROMPT)
    assert out.endswith(b"data: [DONE]\n\n") and out.count(b"[DONE]") == 1
    *relayed, last = events(out)
    assert b"".join(sse(e) for e in relayed) == b"".join(completion_events(WORDS))
    # prompt: the engine's tokenizer (4 words + BOS); completion: one per token event,
    # the empty one included, the empty final event with its finish reason not.
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 5, "completion_tokens": len(WORDS), "total_tokens": 5 + len(WORDS),
        "estimated": True}
    assert node.engine.tokenize_calls == [("/extras/tokenize/count",
                                           {"input": "one two three four", "model": "tiny"})]
    assert node.counter.counted == node.counter.tokenized == 1


async def test_chat_counts_the_contents_plus_a_template_overhead() -> None:
    async with Node(FakeEngine(), KINDS["llama.cpp"]) as node:
        out = await node.stream("/v1/chat/completions", CHAT)
    usage = events(out)[-1]["usage"]
    # "be brief\nhi there you": 5 words + BOS, + 4 per message; the role event is no token
    assert usage["prompt_tokens"] == 6 + 2 * CHAT_MESSAGE_OVERHEAD
    assert usage["completion_tokens"] == len(WORDS)
    assert node.engine.tokenize_calls[0] == (
        "/tokenize", {"content": "be brief\nhi there you", "add_special": True})


async def test_streams_that_need_no_count_pass_unchanged() -> None:
    engine = FakeEngine()
    async with Node(engine, LLAMA_PY) as node:
        plain = {k: v for k, v in PROMPT.items() if k != "stream_options"}
        out = await node.stream("/v1/completions", plain)
        assert out == b"".join(completion_events(WORDS)) + b"data: [DONE]\n\n"
        engine.with_usage = True  # the engine counts itself: its usage is relayed
        out = await node.stream("/v1/completions", PROMPT)
        assert events(out)[-1]["usage"]["prompt_tokens"] == 7
        assert b"estimated" not in out and out.endswith(b"data: [DONE]\n\n")
        up = await node.proxy.open("/v1/completions", orjson.dumps({**PROMPT, "stream": False}))
        assert orjson.loads(await up.read())["usage"]["prompt_tokens"] == 1
        await up.aclose()
    assert engine.tokenize_calls == []


@pytest.mark.parametrize("mode", ["fail", "garbage", "slow"])
async def test_a_failing_tokenizer_falls_back_to_the_estimate(mode: str) -> None:
    engine = FakeEngine()
    engine.tokenize_mode = mode
    async with Node(engine, LLAMA_PY, timeout_s=0.3) as node:
        out = await node.stream("/v1/completions", PROMPT)
        usage = events(out)[-1]["usage"]
        assert usage["prompt_tokens"] == estimate_prompt_tokens(PROMPT)
        assert usage["completion_tokens"] == len(WORDS) and usage["estimated"] is True
        assert out.endswith(b"data: [DONE]\n\n")
        assert node.tokenizer.failures == 1 and node.counter.tokenized == 0
        engine.tokenize_mode = "ok"  # the gate opened again: the next request is served
        assert events(await node.stream("/v1/completions", PROMPT))[-1]["usage"][
            "prompt_tokens"] == 5


async def test_no_tokenize_call_cuts_another_stream_on_an_interrupting_engine() -> None:
    engine = FakeEngine()
    async with Node(engine, LLAMA_PY) as node:
        slow = asyncio.create_task(node.stream("/v1/completions", {**PROMPT, "slow": True}))
        await wait_until(lambda: engine.streams_running == 1, 10, "the slow stream runs")
        fast = await node.stream("/v1/completions", PROMPT)
        await slow
    assert engine.calls_during_stream == 0
    # the first to finish saw the other in flight: estimated prompt; the last one counted
    assert events(fast)[-1]["usage"]["prompt_tokens"] == estimate_prompt_tokens(PROMPT)
    assert events(await slow)[-1]["usage"]["prompt_tokens"] == 5


async def test_an_engine_told_not_to_interrupt_counts_with_others_in_flight() -> None:
    engine = FakeEngine()
    async with Node(engine, LLAMA_PY) as node:
        node.counter = StreamUsageCounter(LLAMA_PY, node.tokenizer,
                                          ["python", "-m", "llama_cpp.server",
                                           "--interrupt_requests", "False"])
        node.proxy._around = node.counter.open
        slow = asyncio.create_task(node.stream("/v1/completions", {**PROMPT, "slow": True}))
        await wait_until(lambda: engine.streams_running == 1, 10, "the slow stream runs")
        fast = await node.stream("/v1/completions", PROMPT)
        await slow
    assert events(fast)[-1]["usage"]["prompt_tokens"] == 5


async def test_new_requests_wait_while_an_interrupting_tokenize_runs() -> None:
    engine = FakeEngine()
    engine.tokenize_mode = "held"
    async with Node(engine, LLAMA_PY) as node:
        first = asyncio.create_task(node.stream("/v1/completions", PROMPT))
        await asyncio.wait_for(engine.tokenizing.wait(), 10)
        second = asyncio.create_task(node.stream("/v1/completions", PROMPT))
        await asyncio.sleep(0.1)
        assert engine.arrivals == ["generate", "tokenize"]  # the second waits at the gate
        engine.release.set()
        await first
        await second
    assert engine.arrivals[:3] == ["generate", "tokenize", "generate"]


async def test_a_non_interrupting_engine_counts_with_others_in_flight() -> None:
    engine = FakeEngine()
    async with Node(engine, KINDS["llama.cpp"]) as node:
        slow = asyncio.create_task(node.stream("/v1/completions", {**PROMPT, "slow": True}))
        await wait_until(lambda: engine.streams_running == 1, 10, "the slow stream runs")
        fast = await node.stream("/v1/completions", PROMPT)
        await slow
    assert events(fast)[-1]["usage"]["prompt_tokens"] == 5


async def test_the_ingress_keeps_a_nodes_count_marked_estimated() -> None:
    async with Node(FakeEngine(), LLAMA_PY) as node:
        out = await node.stream("/v1/completions", PROMPT)
    for strip in (True, False):  # injected by the ingress (stripped) or asked by the client
        scanner = StreamUsageScanner(strip, want_usage_chunk=not strip)
        relayed = scanner.feed(out) + scanner.flush()
        usage, tail = scanner.finish(999, "tiny", chat=False)
        assert usage == (5, len(WORDS), True)
        assert tail == b""  # the node's chunk is the one the client gets
        assert (b'"estimated":true' in relayed) is not strip


async def test_a_connection_broken_after_done_still_ends_the_stream() -> None:
    engine = FakeEngine()
    engine.break_after_done = True
    async with Node(engine, LLAMA_PY) as node:
        out = await node.stream("/v1/completions", PROMPT)
        assert out.endswith(b"data: [DONE]\n\n")
        assert events(out)[-1]["usage"]["completion_tokens"] == len(WORDS)
        engine.break_after_done, engine.break_early = False, True
        with pytest.raises(aiohttp.ClientError):  # a broken stream stays broken
            await node.stream("/v1/completions", PROMPT)


async def test_a_stream_kept_open_after_done_ends_at_done() -> None:
    """The node held a counted stream's [DONE] (to put its usage chunk first) until the
    engine's body ended; an engine that kept it open held the client until the read timed
    out (120 s by default). The answer is complete at [DONE]."""
    engine = FakeEngine()
    engine.open_after_done = True
    async with Node(engine, LLAMA_PY) as node:
        async with asyncio.timeout(10):
            out = await node.stream("/v1/completions", PROMPT)
        assert out.endswith(b"data: [DONE]\n\n")
        assert events(out)[-1]["usage"]["completion_tokens"] == len(WORDS)


def test_token_count_believes_only_plausible_answers() -> None:
    assert token_count({"count": 3}) == 3
    assert token_count({"tokens": [1, 2]}) == 2
    assert token_count([{"id": 1}]) == 1  # TGI
    for bad in ({"count": -1}, {"count": True}, {"count": 10**12}, {"count": "3"}, None, 5,
                {"tokens": "abc"}):
        assert token_count(bad) is None


async def test_the_tokenizer_refuses_oversized_texts_without_a_call() -> None:
    engine = FakeEngine()
    async with Node(engine, LLAMA_PY) as node:
        node.tokenizer.max_chars = 10
        assert await node.tokenizer.count("x" * 11, "tiny") is None
        assert await node.tokenizer.count("x y", "tiny") == 3
    assert len(engine.tokenize_calls) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 400), max_size=12), st.booleans())
def test_the_tally_does_not_depend_on_how_the_stream_is_cut(cuts: list[int], chat: bool
                                                             ) -> None:
    stream = b"".join(chat_events(WORDS) if chat else completion_events(WORDS))
    stream += b": keep-alive\n\ndata: [DONE]\n\n"
    tally = StreamTally()
    out, pos = b"", 0
    for cut in sorted(cuts):
        out += tally.feed(stream[pos:cut])
        pos = max(pos, cut)
    out += tally.feed(stream[pos:]) + tally.flush()
    assert out == stream.removesuffix(b"data: [DONE]\n\n")
    assert tally.held_done and not tally.saw_usage and tally.completion == len(WORDS)
