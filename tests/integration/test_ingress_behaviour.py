"""Ingress behaviours on real sockets in one event loop: rate limits and usage with the real
accounts store (SQLite), mid-stream failures, engine errors passed through, auth switched off,
and simulated engines (`llmfabric engine sim` subprocesses) behind the ingress."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from llmfabric.accounts.ratelimit import RateLimiter
from llmfabric.accounts.store import AccountStore
from llmfabric.clock import SystemClock
from llmfabric.forward import HttpForwarder
from llmfabric.front import build_ingress_app
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import IngressConfig, StaticCandidateSource, TraceEvent
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.protocols import Principal
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.tenancy.accounts_auth import AccountsAuth, StaticPrincipal
from llmfabric.testing.poll import wait_until

from .test_ingress_support import Backend, port_open, serve

MSG: list[Any] = [{"role": "user", "content": "hi"}]


def cand(sid: str, port: int, model: str = "m", provider: str = "p") -> Candidate:
    return Candidate(sid, f"peer-{sid}", provider, f"127.0.0.1:{port}", (), Hardware("H100", 1),
                     ServedModel(model), LoadHints())


class CutBackend(Backend):
    """Streams two chunks, then drops the connection."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if body.get("model") == "bad":
            return web.json_response(
                {"error": {"message": "max_tokens too big", "type": "invalid_request_error",
                           "param": "max_tokens", "code": None}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(2):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": f"p{i}"}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return resp


@contextlib.asynccontextmanager
async def running(app: web.Application) -> AsyncIterator[str]:
    port = free_port()
    runner = await serve(app, port)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def test_rate_limit_429_and_usage_ledger_with_real_accounts(tmp_path: Path) -> None:
    backend_port = free_port()
    b = await serve(Backend("A").app(), backend_port)
    store = await AccountStore.open(f"sqlite:///{tmp_path / 'acc.db'}", background=False)
    try:
        key, plaintext = await store.create_key("test", "alice", requests_per_min=2)
        auth = AccountsAuth(store, RateLimiter(SystemClock()))
        app = build_ingress_app(IngressConfig(), StaticCandidateSource([cand("n1", backend_port)]),
                                HttpForwarder(), auth=auth, usage_sink=auth)
        async with running(app) as url:
            c = openai.AsyncOpenAI(base_url=url, api_key=plaintext, max_retries=0)
            await c.chat.completions.create(model="m", messages=MSG)
            async for _ in await c.chat.completions.create(model="m", messages=MSG, stream=True):
                pass
            with pytest.raises(openai.RateLimitError) as e:
                await c.chat.completions.create(model="m", messages=MSG)
            assert int(e.value.response.headers["Retry-After"]) >= 1
            await store.revoke(key.id, by=None)
            with pytest.raises(openai.AuthenticationError):
                await c.chat.completions.create(model="m", messages=MSG)
            await c.close()
        rows = await store.usage(key_id=key.id)
        assert [(r.model, r.requests, r.prompt_tokens, r.completion_tokens) for r in rows] == [
            ("m", 2, 14, 8)
        ]
    finally:
        await store.aclose()
        await b.cleanup()


async def test_mid_stream_failure_is_reported_and_engine_errors_pass_through() -> None:
    backend_port = free_port()
    b = await serve(CutBackend("cut").app(), backend_port)
    events: list[TraceEvent] = []
    source = StaticCandidateSource([cand("n1", backend_port), cand("n1", backend_port, "bad")])
    app = build_ingress_app(IngressConfig(auth_enabled=False, trace_hook=events.append),
                            source, HttpForwarder())
    try:
        async with running(app) as url:
            c = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
            got: list[str] = []
            with pytest.raises(openai.APIError, match="failed mid-stream"):
                async for ch in await c.chat.completions.create(model="m", messages=MSG,
                                                                 stream=True):
                    got.append(ch.choices[0].delta.content or "")
            assert got == ["p0", "p1"]  # what was streamed before the failure reached the client
            with pytest.raises(openai.BadRequestError) as e:  # engine 400: passed through as is
                await c.chat.completions.create(model="bad", messages=MSG)
            assert e.value.param == "max_tokens" and e.value.status_code == 400
            assert e.value.response.headers["X-Fabric-Node"] == "n1"
            await c.close()
    finally:
        await b.cleanup()
    assert [(ev.model, ev.status, ev.node, ev.stream) for ev in events] == [
        ("m", 200, "n1", True), ("bad", 400, "n1", False)
    ]


def _spawn_sim(model: str, gpu: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # (the child has its own copy of the descriptor)
        return subprocess.Popen(
            [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "engine",
             "sim", "--model", model, "--gpu", gpu, "--port", str(port), "--speed", "50"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


async def _wait_http(port: int, within: float = 20.0) -> None:
    await wait_until(lambda: port_open(port), within, f"engine on port {port} started",
                     interval=0.05)


@pytest.mark.skipif(
    not (Path(__file__).parents[2] / "src/llmfabric/cli/engine.py").exists(),
    reason="the simulated engine CLI is not in this checkout",
)
async def test_simulated_engines_behind_the_ingress(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    procs = [_spawn_sim("sim-7b", gpu, port, tmp_path / f"e{i}.log")
             for i, (gpu, port) in enumerate(zip(("H100-SXM", "A100-80GB"), ports, strict=True))]
    try:
        await asyncio.gather(*(_wait_http(p) for p in ports))
        source = StaticCandidateSource(
            [cand("h100", ports[0], "sim-7b", "uni-a"), cand("a100", ports[1], "sim-7b", "uni-b")]
        )
        events: list[TraceEvent] = []
        app = build_ingress_app(IngressConfig(auth_enabled=False, trace_hook=events.append),
                                source, HttpForwarder())
        async with running(app) as url:
            c = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
            r = await c.chat.completions.create(model="sim-7b", messages=MSG, max_tokens=8)
            assert r.usage is not None and r.usage.completion_tokens > 0
            chunks = [ch async for ch in await c.chat.completions.create(
                model="sim-7b", messages=MSG, max_tokens=8, stream=True,
                extra_headers={"X-Fabric-Providers": "uni-b"})]
            assert all(ch.choices for ch in chunks) and len(chunks) >= 2
            await c.close()
        assert events[-1].node == "a100" and events[-1].completion_tokens
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


async def test_pooled_connections_closed_by_the_node_are_replaced() -> None:
    """The engine drops idle keep-alive connections; the ingress must not fail a request."""
    backend_port = free_port()
    runner = web.AppRunner(Backend("A").app(), access_log=None, keepalive_timeout=0.05)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", backend_port).start()
    app = build_ingress_app(IngressConfig(auth_enabled=False, max_retries=0),
                            StaticCandidateSource([cand("n1", backend_port)]), HttpForwarder())
    try:
        async with running(app) as url:
            c = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
            for _ in range(3):
                r = await c.chat.completions.create(model="m", messages=MSG)
                assert r.choices[0].message.content == "hello from A"
                chunks = [ch async for ch in await c.chat.completions.create(
                    model="m", messages=MSG, stream=True)]
                assert len(chunks) == 4
                await asyncio.sleep(0.2)  # longer than the engine's keep-alive
            await c.close()
    finally:
        await runner.cleanup()


class _OneKeyLimited:
    """Authenticator: "sk-ok" passes, "sk-limited" is always over its rate limit."""

    async def authenticate(self, token: str) -> StaticPrincipal | None:
        return StaticPrincipal(token) if token in ("sk-ok", "sk-limited") else None

    def cached(self, token: str) -> StaticPrincipal | None:
        return None  # no memo: every request awaits authenticate()

    def check_rate(self, principal: Principal) -> float | None:
        return 7.0 if principal.id == "sk-limited" else None

    def expired_at(self, token: str) -> float | None:
        return None


def _counts(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) if fam.name == family
            for s in fam.samples if s.name == family + "_total"}


@pytest.mark.parametrize("server", ["aiohttp", "fast"])
async def test_every_answered_request_is_counted_in_metrics(server: str) -> None:
    backend_port, dead = free_port(), free_port()
    b = await serve(Backend("A").app(), backend_port)
    source = StaticCandidateSource([cand("n1", backend_port), cand("nd", dead, "gone")])
    config = IngressConfig(max_body_bytes=4096, max_retries=0)
    front: FastFront | None = None
    runner: web.AppRunner | None = None
    if server == "fast":
        front = FastFront(Ingress(config, source, HttpForwarder(), auth=_OneKeyLimited()))
        port = await front.start("127.0.0.1", 0)
    else:
        port = free_port()
        runner = await serve(build_ingress_app(config, source, HttpForwarder(),
                                               auth=_OneKeyLimited()), port)
    url = f"http://127.0.0.1:{port}"
    ok = {"Authorization": "Bearer sk-ok"}
    chat = url + "/v1/chat/completions"
    sent: list[tuple[dict[str, str], bytes]] = [
        (ok, b'{"model": "m", "messages": []}'),                        # 200
        ({}, b'{"model": "m"}'),                                         # 401 no key
        ({"Authorization": "Bearer nope"}, b'{"model": "m"}'),           # 401 bad key
        ({"Authorization": "Bearer sk-limited"}, b'{"model": "m"}'),     # 429
        (ok, b"{not json"),                                              # 400 invalid_json
        (ok, b'{"messages": []}'),                                       # 400 missing_model
        (ok, b'{"model": "m", "metadata": {"min_context": "x"}}'),     # 400 constraint
        (ok, b'{"model": "m", "x": "' + b"y" * 5000 + b'"}'),           # 400 too large
        (ok, b'{"model": "nope"}'),                                      # 404
        (ok, b'{"model": "m", "metadata": {"gpu": "B200"}}'),           # 503 filtered
        (ok, b'{"model": "gone"}'),                                      # 502
    ]
    statuses = []
    try:
        async with aiohttp.ClientSession() as s:
            for headers, body in sent:
                async with s.post(chat, data=body, headers=headers) as r:
                    await r.read()
                    statuses.append(r.status)
            async with s.get(url + "/metrics") as r:
                text = await r.text()
    finally:
        if front is not None:
            await front.aclose()
        if runner is not None:
            await runner.cleanup()
        await b.cleanup()
    assert statuses == [200, 401, 401, 429, 400, 400, 400, 400, 404, 503, 502]
    req = _counts(text, "llmfabric_ingress_requests")
    assert sum(req.values()) == len(sent)
    assert req[(("model", "m"), ("status", "200"))] == 1
    assert req[(("model", ""), ("status", "401"))] == 2
    assert req[(("model", ""), ("status", "429"))] == 1
    assert req[(("model", ""), ("status", "400"))] == 3  # refused before a model was known
    assert req[(("model", "m"), ("status", "400"))] == 1
    assert req[(("model", "other"), ("status", "404"))] == 1  # unknown: one bounded label
    assert req[(("model", "m"), ("status", "503"))] == 1
    assert req[(("model", "gone"), ("status", "502"))] == 1
    errs = _counts(text, "llmfabric_ingress_errors")
    assert errs == {
        (("code", "invalid_api_key"), ("status", "401")): 2,
        (("code", "rate_limit_exceeded"), ("status", "429")): 1,
        (("code", "invalid_json"), ("status", "400")): 1,
        (("code", "missing_model"), ("status", "400")): 1,
        (("code", "invalid_constraint"), ("status", "400")): 1,
        (("code", "request_too_large"), ("status", "400")): 1,
        (("code", "model_not_found"), ("status", "404")): 1,
        (("code", "filtered"), ("status", "503")): 1,
        (("code", "upstream_failed"), ("status", "502")): 1,
    }
