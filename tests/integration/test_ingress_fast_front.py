"""The lean httptools front (`FastFront`): the official openai SDK (sync, streaming, errors)
and raw-socket edge cases (keep-alive reuse, pipelining, chunked bodies, oversized body,
malformed request line, unknown routes, client disconnect mid-stream). Real sockets on
loopback: mock engines on aiohttp, the front on its own loop in a thread."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import orjson
import pytest
from aiohttp import web

from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.tenancy.accounts_auth import StaticKeys

from ._sdk_clients import tracked
from .test_ingress_support import Backend, LoopThread, serve, wait_port

KEY = "sk-fast"
MAX_BODY = 4096


@dataclass
class Front:
    base: str
    port: int
    backend: Backend
    ingress: Ingress


class SlowStream:
    """An engine streaming many chunks slowly (to disconnect from mid-stream)."""

    def __init__(self) -> None:
        self.sent = 0
        self.finished = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(200):
                await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n'
                                 % i)
                self.sent += 1
                await asyncio.sleep(0.02)
            self.finished = True
        except ConnectionError:
            pass
        return resp


def _cand(sid: str, model: str, port: int) -> Candidate:
    return Candidate(
        session_id=sid, peer_id="", provider_id="p", http_addr=f"127.0.0.1:{port}", relays=(),
        hardware=Hardware(gpu_model="H100", gpu_count=1), model=ServedModel(model),
        load=LoadHints(),
    )


@pytest.fixture(scope="module")
def front() -> Iterator[tuple[Front, SlowStream]]:
    lt = LoopThread()
    backend = Backend("b0")
    slow = SlowStream()
    bport, sport = free_port(), free_port()
    runners = [lt.call(lambda: serve(backend.app(), bport)),
               lt.call(lambda: serve(slow.app(), sport))]
    forwarder = HttpForwarder()
    ingress = Ingress(
        IngressConfig(max_body_bytes=MAX_BODY, max_retries=0),
        StaticCandidateSource([_cand("node-b0", "m", bport), _cand("node-slow", "slow", sport)]),
        forwarder, auth=StaticKeys({KEY: "k1"}),
    )
    ff = FastFront(ingress)

    async def start() -> int:
        return await ff.start("127.0.0.1", 0)

    port = lt.call(start)
    wait_port(port)
    try:
        yield Front(f"http://127.0.0.1:{port}/v1", port, backend, ingress), slow
    finally:
        lt.call(ff.aclose)
        lt.call(forwarder.aclose)
        for r in runners:
            lt.call(r.cleanup)
        lt.stop()


def _client(f: Front, key: str = KEY) -> openai.OpenAI:
    return tracked(openai.OpenAI(base_url=f.base, api_key=key, max_retries=0, timeout=20))


def test_sdk_chat_completions_and_models(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    c = _client(f)
    raw = c.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-fabric-node"] == "node-b0"
    out = raw.parse()
    assert out.choices[0].message.content == "hello from b0"
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert sorted(m.id for m in c.models.list()) == ["m", "slow"]
    emb = c.embeddings.create(model="m", input="x")
    assert emb.data[0].embedding == [0.1, 0.2, 0.3]


def test_sdk_streaming(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    c = _client(f)
    stream = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == "b0-0 b0-1 b0-2 b0-3 "
    # Several requests on the SDK's pooled keep-alive connection still work.
    for _ in range(3):
        s = c.completions.create(model="m", prompt="p", stream=True)
        assert "".join(ch.choices[0].text for ch in s if ch.choices) == text


def test_sdk_errors(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    with pytest.raises(openai.AuthenticationError) as e401:
        _client(f, "sk-wrong").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
    assert e401.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as e404:
        _client(f).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}])
    assert e404.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e400:
        _client(f).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * (MAX_BODY + 10)}])
    assert e400.value.code == "request_too_large"


# -- raw sockets -------------------------------------------------------------------------


def _connect(f: Front) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", f.port), timeout=10)
    return s


def _read_response(s: socket.socket, buf: bytearray, head_only: bool = False
                   ) -> tuple[int, dict[str, str], bytes]:
    """Read one response (Content-Length or chunked) from s; leftover stays in buf."""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed before a response head")
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    buf[:] = rest
    if head_only:
        return status, headers, b""
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("closed mid-body")
            buf += data
        body = bytes(buf[:n])
        del buf[:n]
        return status, headers, body
    assert headers.get("transfer-encoding") == "chunked"
    out = bytearray()
    while True:
        while b"\r\n" not in buf:
            buf += s.recv(65536)
        line, _, _ = bytes(buf).partition(b"\r\n")
        size = int(line, 16)
        need = len(line) + 2 + size + 2
        while len(buf) < need:
            buf += s.recv(65536)
        out += buf[len(line) + 2:len(line) + 2 + size]
        del buf[:need]
        if size == 0:
            return status, headers, bytes(out)


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_keep_alive_reuse_and_pipelining(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    with _connect(f) as s:
        buf = bytearray()
        for _ in range(3):  # sequential requests on one connection
            s.sendall(_post("/v1/chat/completions", CHAT))
            status, headers, body = _read_response(s, buf)
            assert status == 200 and "connection" not in headers
            assert orjson.loads(body)["choices"][0]["message"]["content"] == "hello from b0"
        # Pipelined: three requests in one write are answered in order.
        s.sendall(_post("/v1/chat/completions", CHAT) + b"GET /v1/nothing HTTP/1.1\r\n"
                  b"Host: x\r\n\r\n" + _post("/v1/embeddings", b'{"model":"m","input":"x"}'))
        st1, _, _ = _read_response(s, buf)
        st2, _, b2 = _read_response(s, buf)
        st3, _, b3 = _read_response(s, buf)
        assert (st1, st2, st3) == (200, 404, 200)
        assert orjson.loads(b2)["error"]["code"] == "not_found"
        assert orjson.loads(b3)["object"] == "list"


def test_chunked_request_body_and_streamed_response(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    body = orjson.dumps({"model": "m", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
    half = len(body) // 2
    chunked = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (half, body[:half], len(body) - half,
                                                      body[half:])
    with _connect(f) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{KEY}\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunked)
        buf = bytearray()
        status, headers, out = _read_response(s, buf)
        assert status == 200
        assert headers["content-type"] == "text/event-stream"
        assert headers["x-fabric-node"] == "node-b0"
        assert out.endswith(b"data: [DONE]\n\n") and b"b0-3" in out


def test_oversized_body_answers_400_and_closes(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    with _connect(f) as s:  # declared too large: answered before the body is sent
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  + KEY.encode() + b"\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 1000)
        buf = bytearray()
        status, headers, body = _read_response(s, buf)
        assert status == 400 and headers["connection"] == "close"
        assert orjson.loads(body)["error"]["code"] == "request_too_large"
        assert s.recv(65536) == b""  # the server closed its side
    with _connect(f) as s:  # chunked, grows past the limit
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n"
                  + b"%x\r\n%b\r\n" % (MAX_BODY + 1, b"y" * (MAX_BODY + 1)))
        status, _, body = _read_response(s, bytearray())
        assert status == 400
        assert orjson.loads(body)["error"]["code"] == "request_too_large"


def test_malformed_request_line_and_methods(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    with _connect(f) as s:
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        status, headers, body = _read_response(s, bytearray())
        assert status == 400 and headers["connection"] == "close"
        assert orjson.loads(body)["error"]["code"] == "bad_request"
    with _connect(f) as s:
        buf = bytearray()
        s.sendall(b"HEAD /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = _read_response(s, buf, head_only=True)
        assert status == 405 and headers["allow"] == "POST"
        assert int(headers["content-length"]) > 0 and buf == b""
        s.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = _read_response(s, buf)
        assert status == 405 and orjson.loads(body)["error"]["code"] == "method_not_allowed"
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # no key
        status, _, body = _read_response(s, buf)
        assert status == 401 and orjson.loads(body)["error"]["code"] == "invalid_api_key"
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status, headers, body = _read_response(s, buf)
        assert status == 200 and b"llmfabric" in body and headers["connection"] == "close"


def test_client_disconnect_mid_stream_stops_the_upstream(
    front: tuple[Front, SlowStream],
) -> None:
    f, slow = front
    body = orjson.dumps({"model": "slow", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
    with _connect(f) as s:
        s.sendall(_post("/v1/chat/completions", body))
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    sent = slow.sent
    while time.monotonic() < deadline:  # the engine side is closed soon after
        time.sleep(0.2)
        if slow.sent == sent:
            break
        sent = slow.sent
    assert not slow.finished and slow.sent < 200
    # The front keeps serving.
    assert _client(f).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]).choices


def test_expect_100_continue(front: tuple[Front, SlowStream]) -> None:
    f, _ = front
    with _connect(f) as s:
        s.sendall(_post("/v1/chat/completions", b"", "Expect: 100-continue\r\n")
                  .replace(b"Content-Length: 0", b"Content-Length: %d" % len(CHAT)))
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        assert bytes(buf).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        del buf[:25]
        s.sendall(CHAT)
        status, _, body = _read_response(s, buf)
        assert status == 200 and b"hello from b0" in body
