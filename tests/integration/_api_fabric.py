"""A real ingress (lean front and aiohttp app) in front of node engine proxies, the simulated
engine, and a scripted engine for what the simulated one does not do (tool calls, logprobs,
a native /v1/responses, rerank and tokenize). Shared by the Responses and Anthropic tests."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.forward import EngineProxy, HttpForwarder, add_engine_proxy_routes
from llmfabric.front import build_ingress_app
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import FORWARD_PREFIX, Ingress, IngressConfig, RecordsCandidateSource
from llmfabric.net.ports import free_port
from llmfabric.tenancy.accounts_auth import StaticKeys

from .test_ingress_support import LoopThread, record, serve, wait_port

KEY = "sk-api"
SIM = "llama-3.1-8b"
TOOLY = "tooly"
NATIVE = "native-resp"


@dataclass
class ScriptedEngine:
    """Answers chat with a tool call when tools are offered, else with JSON text (and
    logprobs when asked); serves /v1/responses natively, rerank and tokenize."""

    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        for path in ("/v1/responses", "/v1/rerank", "/tokenize"):
            app.router.add_post(path, self.other)
        return app

    def last(self, path: str) -> dict[str, Any]:
        return next(b for p, b in reversed(self.bodies) if p == path)

    async def other(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.bodies.append((request.path, body))
        if request.path == "/tokenize":
            return web.json_response({"tokens": [1, 2, 3], "count": 3, "max_model_len": 8192})
        if request.path == "/v1/rerank":
            return web.json_response({"id": "rr", "model": body["model"], "results": [
                {"index": i, "relevance_score": 1.0 / (i + 1)}
                for i, _ in enumerate(body.get("documents", []))]})
        if body.get("stream"):  # a native Responses event stream
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            done = {"id": "resp_native", "object": "response", "status": "completed",
                    "model": body["model"], "output": [],
                    "usage": {"input_tokens": 11, "output_tokens": 2, "total_tokens": 13}}
            for ev in ({"type": "response.output_text.delta", "sequence_number": 0,
                        "item_id": "m", "output_index": 0, "content_index": 0,
                        "delta": "native", "logprobs": []},
                       {"type": "response.completed", "sequence_number": 1,
                        "response": done}):
                await resp.write(b"event: " + ev["type"].encode() + b"\ndata: "  # type: ignore[attr-defined]
                                 + orjson.dumps(ev) + b"\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({  # a native Responses API reply
            "id": "resp_native", "object": "response", "created_at": 1, "status": "completed",
            "model": body["model"], "output": [{
                "type": "message", "id": "msg_n", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "native answer",
                             "annotations": []}]}],
            "usage": {"input_tokens": 11, "output_tokens": 2, "total_tokens": 13},
        })

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append((request.path, body))
        model = body["model"]
        usage = {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            call = {"id": "call_1", "type": "function",
                    "function": {"name": name, "arguments": '{"city": "Paris"}'}}
            if not body.get("stream"):
                return web.json_response({
                    "id": "c1", "object": "chat.completion", "created": 1, "model": model,
                    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                        "role": "assistant", "content": None, "tool_calls": [call]}}],
                    "usage": usage})
            chunks: list[dict[str, Any]] = [
                {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1",
                                                      "type": "function", "function": {
                                                          "name": name, "arguments": ""}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
            ]
            return await self._stream(request, model, chunks, "tool_calls", usage, None)
        if body.get("stream") and body["messages"][-1].get("content") == "die mid-stream":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            first = {"id": "c4", "object": "chat.completion.chunk", "created": 1,
                     "model": model, "choices": [{"index": 0, "delta": {"content": "par"},
                                                  "finish_reason": None}]}
            await resp.write(b"data: " + orjson.dumps(first) + b"\n\n")
            assert request.transport is not None
            request.transport.close()  # the engine dies after the first token
            return resp
        text = '{"city": "Paris"}'
        lp = None
        if body.get("logprobs"):
            lp = {"content": [{"token": text, "logprob": -0.25, "bytes": list(text.encode()),
                               "top_logprobs": []}]}
        stop = body.get("stop")
        matched = stop[0] if isinstance(stop, list) and stop else None
        if not body.get("stream"):
            return web.json_response({
                "id": "c2", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": matched,
                             "logprobs": lp,
                             "message": {"role": "assistant", "content": text}}],
                "usage": usage})
        return await self._stream(request, model, [{"role": "assistant", "content": text}],
                                  "stop", usage, matched)

    async def _stream(self, request: web.Request, model: str, deltas: list[dict[str, Any]],
                      finish: str, usage: dict[str, int], matched: str | None
                      ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for d in deltas:
            chunk = {"id": "c3", "object": "chat.completion.chunk", "created": 1,
                     "model": model, "choices": [{"index": 0, "delta": d,
                                                  "finish_reason": None}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        last = {"id": "c3", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish,
                             "stop_reason": matched}]}
        await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
        u = {"id": "c3", "object": "chat.completion.chunk", "created": 1, "model": model,
             "choices": [], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(u) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp


@dataclass
class ApiFabric:
    fast_url: str  # the lean front (llmfabric ingress's default)
    aio_url: str  # the aiohttp app (the node's routes)
    keys: StaticKeys
    scripted: ScriptedEngine
    sim_url: str = ""  # the simulated engine itself (its /sim/control: make it fail)

    def usage(self, model: str) -> list[int]:
        """[prompt tokens, completion tokens, requests, estimated requests] of the key."""
        return list(self.keys.usage.get(("k1", model), [0, 0, 0, 0]))


def api_fabric() -> Iterator[ApiFabric]:
    lt = LoopThread()
    keys = StaticKeys({KEY: "k1"})
    scripted = ScriptedEngine()
    runners: list[web.AppRunner] = []
    proxies: list[EngineProxy] = []
    fronts: list[FastFront] = []
    forwarders: list[HttpForwarder] = []
    aio_port = free_port()
    ports: dict[str, int] = {}

    async def start() -> None:
        addrs: dict[str, str] = {}
        engines = {"sim": SimEngine(SimEngineConfig(models=(SIM,), speed=50)).app(),
                   "scripted": scripted.app()}
        for name, app in engines.items():
            eport, nport = free_port(), free_port()
            runners.append(await serve(app, eport))
            ports[name] = eport
            proxy = EngineProxy(f"http://127.0.0.1:{eport}")
            proxies.append(proxy)
            node = web.Application()
            add_engine_proxy_routes(node, proxy)
            runners.append(await serve(node, nport))
            addrs[name] = f"127.0.0.1:{nport}"
        records = [record("nSim", "uni-a", addrs["sim"], [SIM]),
                   record("nScr", "uni-b", addrs["scripted"], [TOOLY, NATIVE])]
        source = RecordsCandidateSource(lambda: [(r, False) for r in records])
        config = IngressConfig(node_id="ing", max_body_bytes=64 * 1024,
                               native_responses_models=(NATIVE,))
        fwd = HttpForwarder(FORWARD_PREFIX)
        forwarders.append(fwd)
        fast = FastFront(Ingress(config, source, fwd, auth=keys, usage_sink=keys,
                                 rng=random.Random(1)))
        fronts.append(fast)
        ports["fast"] = await fast.start("127.0.0.1", 0)
        app = build_ingress_app(config, source, HttpForwarder(FORWARD_PREFIX), auth=keys,
                                usage_sink=keys, rng=random.Random(2))
        runners.append(await serve(app, aio_port))

    lt.call(start)
    wait_port(aio_port)
    try:
        yield ApiFabric(f"http://127.0.0.1:{ports['fast']}", f"http://127.0.0.1:{aio_port}",
                        keys, scripted, f"http://127.0.0.1:{ports['sim']}")
    finally:
        async def stop() -> None:
            for f in fronts:
                await f.aclose()
            for fw in forwarders:
                await fw.aclose()
            for r in reversed(runners):
                await r.cleanup()
            for p in proxies:
                await p.aclose()
        lt.call(stop)
        lt.stop()
