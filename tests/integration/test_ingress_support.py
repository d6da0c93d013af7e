"""Support for the ingress integration tests: a small OpenAI-compatible backend and a fabric
(backends + ingress) run on a private event loop in a thread, so the sync `openai` client can
call it. Real sockets on loopback throughout."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import socket
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import openai
import orjson
from aiohttp import web

from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    NodeMeta,
    NodeRecord,
    ServedModel,
)
from llmfabric.testing.poll import wait_until_sync


@dataclass
class Backend:
    """An OpenAI-compatible mock engine. mode: "ok" or "fail500"."""

    name: str
    mode: str = "ok"
    chunks: int = 4
    hits: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        if self.mode == "fail500":
            return web.json_response({"error": {"message": "engine exploded"}}, status=500)
        model = body["model"]
        text = f"hello from {self.name}"
        usage = {"prompt_tokens": 7, "completion_tokens": self.chunks,
                 "total_tokens": 7 + self.chunks}
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "stop"}
                if chat else {"index": 0, "text": text, "finish_reason": "stop"}
            )
            return web.json_response({
                "id": "x1", "object": "chat.completion" if chat else "text_completion",
                "created": 1, "model": model, "choices": [choice], "usage": usage,
            })
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        include = (body.get("stream_options") or {}).get("include_usage")
        for i in range(self.chunks):
            piece = f"{self.name}-{i} "
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None}
                      if chat else {"index": 0, "text": piece, "finish_reason": None})
            chunk = {"id": "x1", "object": "chat.completion.chunk", "created": 1,
                     "model": model, "choices": [choice]}
            if include:
                chunk["usage"] = None
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if include:
            last = {"id": "x1", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [], "usage": usage}
            await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        self.hits += 1
        body = orjson.loads(await request.read())
        return web.json_response({
            "object": "list", "model": body["model"],
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3},
        })


def record(sid: str, provider: str, addr: str, models: Iterable[str],
           state: Lifecycle = Lifecycle.SERVING, gpu: str = "H100-SXM",
           relays: tuple[str, ...] = ()) -> NodeRecord:
    return NodeRecord(
        session_id=sid, peer_id=f"peer-{sid}", public_key=b"", state=state, incarnation=0,
        version=1, updated_at=0.0,
        meta=NodeMeta(provider_id=provider, http_addr=addr, relays=relays,
                      hardware=Hardware(gpu_model=gpu, gpu_count=1),
                      models=tuple(ServedModel(m) for m in models)),
    )


class LoopThread:
    """An asyncio loop in a daemon thread; `call(coro_fn)` runs a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def models_once_up(client: openai.AsyncOpenAI, proc: subprocess.Popen[Any],
                         within: float = 60.0) -> Any:
    """`client.models.list()` once the ingress process `proc` answers: retried on connection
    errors for `within` s, or until the process has exited."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            return await client.models.list()
        except openai.APIConnectionError:
            if loop.time() > deadline or proc.poll() is not None:
                raise
            await asyncio.sleep(0.1)


def stop_group(proc: subprocess.Popen[Any], within: float = 15.0) -> None:
    """SIGTERM the process group `proc` leads (a clean shutdown: an ingress flushes its
    ledgers), SIGKILL it if it has not exited `within` s; then reaped."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, within: float = 10.0) -> None:
    wait_until_sync(lambda: port_open(port), within, f"port {port} open", interval=0.02)


@dataclass
class RawResponse:
    status_code: int
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self) -> Any:
        return orjson.loads(self.content)


def raw_request(method: str, url: str, content: bytes | None = None,
                headers: dict[str, str] | None = None) -> RawResponse:
    """A plain HTTP/1.1 request (for inputs the SDK cannot produce, e.g. malformed JSON)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=20)
    try:
        conn.request(method, u.path, body=content, headers=headers or {})
        r = conn.getresponse()
        return RawResponse(r.status, {k: v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()
