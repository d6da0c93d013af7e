"""One HTTP port, two servers: the lean front answers the OpenAI routes and hands every other
connection to an aiohttp app (what a fabric ingress node does on its HTTP port). Real sockets
on loopback: a mock engine and the node-like app on aiohttp, raw HTTP/1.1 clients."""

from __future__ import annotations

import asyncio
import pathlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web

from llmfabric.forward import HttpForwarder
from llmfabric.front import add_ingress_routes
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net.server_tls import ServerTls
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.testing.tls_files import write_cert

from .test_ingress_support import Backend, serve

pytestmark = pytest.mark.integration

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


@dataclass
class Env:
    port: int
    front: FastFront
    app_hits: list[str]


def _request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One Content-Length response (the routes used here answer with one)."""
    status_line = await asyncio.wait_for(reader.readline(), 10)
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = Backend("b0")
    engine = await serve(backend.app(), 0)
    engine_port = engine.addresses[0][1]
    cand = Candidate("node-b0", "", "p", f"127.0.0.1:{engine_port}", (), Hardware("H100", 1),
                     ServedModel("m"), LoadHints())
    forwarder = HttpForwarder()
    ingress = Ingress(IngressConfig(max_retries=0, auth_enabled=False),
                      StaticCandidateSource([cand]), forwarder)
    hits: list[str] = []
    app = web.Application()

    async def healthz(request: web.Request) -> web.Response:
        hits.append("healthz")
        return web.json_response({"status": "ok"})

    async def echo(request: web.Request) -> web.Response:
        hits.append("echo")
        return web.Response(body=await request.read())

    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/fabric/echo", echo)
    add_ingress_routes(app, ingress)  # (for requests later on a handed-over connection)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    assert runner.server is not None
    front = FastFront(ingress, serve_metrics=False, fallback=runner.server)
    port = await front.start("127.0.0.1", 0)
    try:
        yield Env(port, front, hits)
    finally:
        await front.aclose()
        await runner.cleanup()
        await forwarder.aclose()
        await engine.cleanup()


async def test_openai_routes_stay_on_the_front_other_paths_go_to_the_app(env: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
    writer.write(_request("POST", "/v1/chat/completions", CHAT))
    status, headers, body = await _response(reader)
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
    assert "server" not in headers  # the lean front names no server; aiohttp does
    assert env.front.handed_over == 0
    # The same keep-alive connection, now a dashboard/fleet path: handed over.
    writer.write(_request("GET", "/healthz"))
    status, headers, body = await _response(reader)
    assert (status, orjson.loads(body)) == (200, {"status": "ok"})
    assert "aiohttp" in headers.get("server", "")
    assert env.front.handed_over == 1 and env.app_hits == ["healthz"]
    # From here aiohttp serves the connection, OpenAI routes included (the same core).
    writer.write(_request("POST", "/v1/chat/completions", CHAT))
    status, headers, body = await _response(reader)
    assert status == 200 and "aiohttp" in headers.get("server", "")
    writer.close()


async def test_a_handed_over_request_keeps_every_byte_of_a_split_body(env: Env) -> None:
    body = b"x" * 70_000
    raw = _request("POST", "/v1/fabric/echo", body)
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
    for i in range(0, len(raw), 1000):  # head and body over many reads
        writer.write(raw[i:i + 1000])
        await writer.drain()
        await asyncio.sleep(0)
    status, _, got = await _response(reader)
    assert status == 200 and got == body
    writer.close()


async def test_requests_pipelined_behind_a_handed_over_one_reach_the_app(env: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
    writer.write(_request("GET", "/healthz") + _request("POST", "/v1/fabric/echo", b"abc"))
    assert (await _response(reader))[0] == 200
    status, _, got = await _response(reader)
    assert (status, got) == (200, b"abc")
    assert env.app_hits == ["healthz", "echo"]
    writer.close()


async def test_a_fallback_path_pipelined_inside_an_api_read_is_refused_clearly(env: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
    writer.write(_request("POST", "/v1/chat/completions", CHAT) + _request("GET", "/healthz"))
    assert (await _response(reader))[0] == 200  # answered in order
    status, _, body = await _response(reader)
    assert status == 400 and b"new connection" in body
    assert env.app_hits == []
    writer.close()


async def test_unknown_paths_without_a_fallback_answer_404(env: Env) -> None:
    bare = FastFront(env.front.ingress, serve_metrics=False)
    port = await bare.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request("GET", "/healthz"))
        status, _, body = await _response(reader)
        assert status == 404 and orjson.loads(body)["error"]["code"] == "not_found"
        writer.close()
    finally:
        await bare.aclose()


async def test_a_tls_connection_is_handed_over_too(env: Env, tmp_path: pathlib.Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    write_cert(cert, key, "node")
    tls = ServerTls(cert, key)
    front = FastFront(env.front.ingress, serve_metrics=False, fallback=env.front.fallback)
    port = await front.start("127.0.0.1", 0, ssl=tls.context)
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        writer.write(_request("POST", "/v1/chat/completions", CHAT))
        assert (await _response(reader))[0] == 200
        writer.write(_request("GET", "/healthz") + _request("POST", "/v1/fabric/echo", b"tls"))
        assert (await _response(reader))[0] == 200
        status, _, got = await _response(reader)
        assert (status, got) == (200, b"tls") and front.handed_over == 1
        writer.close()
    finally:
        await front.aclose()
