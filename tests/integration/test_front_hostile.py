"""The lean front (`FastFront`) against hostile clients and hostile providers: oversized URLs
and heads, slowloris heads and bodies, pre-auth bodies, connection floods, CR/LF in session
ids, endless upstream bodies, newline-free SSE, absurd usage claims, and clients that leave
mid-stream. After every attack an honest client is still served. Real sockets on loopback:
hostile engines on aiohttp, the front on its own loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web

from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.front.front_limits import FrontLimits, safe_header_value
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate
from llmfabric.tenancy.accounts_auth import StaticKeys
from llmfabric.untrusted import log_due

from .test_ingress_support import Backend, LoopThread, serve, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.hostile]

KEY = "sk-honest"
LIMITS = FrontLimits(max_url_bytes=4096, max_head_bytes=16 * 1024, max_headers=50,
                     header_timeout_s=0.6, body_timeout_s=0.6, max_connections=400,
                     max_connections_per_client=40)
LINE_CAP = 64 * 1024
RESPONSE_CAP = 1024 * 1024
EVIL_SID = "node-evil\r\nX-Injected: 1"


class Hostile:
    """An engine that misbehaves differently per model."""

    def __init__(self) -> None:
        self.slow_sent = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        model = body["model"]
        if model == "usage":  # absurd usage claims
            return web.json_response({"choices": [], "usage": {
                "prompt_tokens": 2**64 - 1, "completion_tokens": -5}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            if model == "endless":  # a body that never ends (sent as not-a-stream)
                while True:
                    await resp.write(b"x" * 65536)
            elif model == "noline":  # SSE without a newline, then a long silence
                for _ in range(16):
                    await resp.write(b"y" * 65536)
                await asyncio.sleep(5)
            elif model == "slow":  # a long stream the client abandons
                for i in range(400):
                    await resp.write(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i)
                    self.slow_sent += 1
                    await asyncio.sleep(0.01)
        return resp


@dataclass
class Env:
    port: int
    keys: StaticKeys
    hostile: Hostile
    front: FastFront
    lt: LoopThread


def _cand(sid: str, model: str, port: int) -> Candidate:
    return Candidate(
        session_id=sid, peer_id="", provider_id="p", http_addr=f"127.0.0.1:{port}", relays=(),
        hardware=Hardware(gpu_model="H100", gpu_count=1), model=ServedModel(model),
        load=LoadHints(),
    )


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    lt = LoopThread()
    honest, hostile = Backend("b0"), Hostile()
    bport, hport = free_port(), free_port()
    runners = [lt.call(lambda: serve(honest.app(), bport)),
               lt.call(lambda: serve(hostile.app(), hport))]
    keys = StaticKeys({KEY: "k1"})
    cands = [_cand("node-b0", "m", bport), _cand(EVIL_SID, "evil", bport)]
    cands += [_cand(f"node-{m}", m, hport) for m in ("usage", "endless", "noline", "slow")]
    forwarder = HttpForwarder()
    ingress = Ingress(
        IngressConfig(max_retries=0, max_response_bytes=RESPONSE_CAP,
                      max_sse_line_bytes=LINE_CAP),
        StaticCandidateSource(cands), forwarder, auth=keys, usage_sink=keys,
    )
    front = FastFront(ingress, limits=LIMITS)

    async def start() -> int:
        return await front.start("127.0.0.1", 0)

    port = lt.call(start)
    wait_port(port)
    try:
        yield Env(port, keys, hostile, front, lt)
    finally:
        lt.call(front.aclose)
        lt.call(forwarder.aclose)
        for r in runners:
            lt.call(r.cleanup)
        lt.stop()


def _chat(model: str = "m", **extra: object) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                         **extra})


def honest_call(e: Env, source: str = "127.0.0.1", within: float = 3.0) -> None:
    """An honest request is answered correctly and quickly."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("POST", "/v1/chat/completions", body=_chat(),
                     headers={"Authorization": f"Bearer {KEY}",
                              "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, data
    assert orjson.loads(data)["choices"][0]["message"]["content"] == "hello from b0"
    assert time.monotonic() - t0 < within


def _connect(e: Env) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", e.port), timeout=10)
    return s


def _read_all(s: socket.socket, within: float = 5.0) -> bytes:
    """Everything until the server closes (fails if it does not close within `within`)."""
    s.settimeout(within)
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    return out


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0


def test_oversized_url_is_414_and_closed(env: Env) -> None:
    with _connect(env) as s:
        s.sendall(b"GET /v1/models?" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = _read_all(s)
    assert _status(raw) == 414
    honest_call(env)


def test_oversized_or_too_many_headers_are_431(env: Env) -> None:
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(60))
    big = b"X-Big: " + b"b" * 20_000 + b"\r\n"
    for extra in (many, big):
        with _connect(env) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
            assert _status(_read_all(s)) == 431
    honest_call(env)


def test_endless_header_is_cut_off_before_it_ends(env: Env) -> None:
    """A 13 MB header value (the audit's URL was 13 MB): the front answers 431 and closes
    long before the client could finish sending it."""
    with _connect(env) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        sent = 0
        raw = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < 13_000_000 and not raw:
                s.sendall(b"h" * 65536)
                sent += 65536
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    raw = s.recv(65536)
                s.setblocking(True)
    assert sent < 13_000_000, "no answer before the whole 13 MB header was sent"
    assert _status(raw) == 431
    honest_call(env)


def test_slowloris_head_is_closed_with_408(env: Env) -> None:
    with _connect(env) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for i in range(60):  # one header byte every 0.1 s: never a complete head
                s.sendall(b"X-%d: 1\r\n" % i)
                s.settimeout(0.1)
                try:
                    closed = s.recv(65536)
                except TimeoutError:
                    continue
                break
        elapsed = time.monotonic() - t0
    assert _status(closed) == 408
    assert elapsed < LIMITS.header_timeout_s * 1.5 + 2.5  # (a loaded machine: slack)
    honest_call(env)


def test_slow_body_is_closed_with_408(env: Env) -> None:
    with _connect(env) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        t0 = time.monotonic()
        raw = _read_all(s)
    assert _status(raw) == 408
    assert time.monotonic() - t0 < LIMITS.body_timeout_s * 1.5 + 2.5
    honest_call(env)


@pytest.mark.parametrize("auth", [b"", b"Authorization: Bearer sk-wrong\r\n"])
def test_key_is_checked_before_the_body_is_read(env: Env, auth: bytes) -> None:
    """A 6 MB body announced without a valid key: 401 arrives before the body is sent, and
    pipelined requests behind it are never served."""
    with _connect(env) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth
                  + b"Content-Length: 6000000\r\n\r\n")
        raw = _read_all(s, within=3.0)  # we never sent a body byte
    assert _status(raw) == 401
    assert b"invalid_api_key" in raw
    honest_call(env)


def test_pipelined_requests_behind_a_keyless_one_are_dropped(env: Env) -> None:
    one = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
           % (len(_chat()), _chat()))
    with _connect(env) as s:
        s.sendall(one * 20)
        raw = _read_all(s)
    assert raw.count(b"HTTP/1.1 ") == 1 and _status(raw) == 401


def test_connection_flood_is_capped_per_client(env: Env) -> None:
    flood: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(LIMITS.max_connections_per_client + 20):
            s = _connect(env)
            flood.append(s)
        time.sleep(0.2)
        for s in flood:
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                if _status(s.recv(4096)) == 503:
                    refused += 1
        assert refused >= 20
        # Another client address is still served while the flood holds its connections.
        honest_call(env, source="127.0.0.2")
    finally:
        for s in flood:
            s.close()
    time.sleep(0.2)
    honest_call(env)


def test_crlf_in_a_session_id_cannot_inject_headers(env: Env) -> None:
    assert safe_header_value(EVIL_SID) == "node-evilX-Injected: 1"
    for stream in (False, True):
        with _connect(env) as s:
            body = _chat("evil", stream=stream)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                      b"Bearer " + KEY.encode() + b"\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            raw = _read_all(s)
        head = raw.split(b"\r\n\r\n", 1)[0]
        assert _status(raw) == 200
        assert b"\r\nX-Injected" not in head
        assert b"X-Fabric-Node: node-evilX-Injected: 1" in head


def _post(e: Env, body: bytes, timeout: float = 10, path: str = "/v1/chat/completions"
          ) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body,
                     headers={"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_endless_upstream_body_fails_at_the_cap(env: Env) -> None:
    t0 = time.monotonic()
    status, data = _post(env, _chat("endless"))
    assert status == 502
    assert b"larger than" in data
    assert time.monotonic() - t0 < 5
    honest_call(env)


def test_newline_free_sse_is_relayed_not_held(env: Env) -> None:
    """1 MiB without a newline, then silence: the client gets the bytes while the upstream
    still holds the stream open (the scanner holds at most one line cap)."""
    conn = http.client.HTTPConnection("127.0.0.1", env.port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", body=_chat("noline", stream=True),
                     headers={"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        assert resp.status == 200
        got = 0
        t0 = time.monotonic()
        while got < 16 * 65536 - LINE_CAP and time.monotonic() - t0 < 3:
            got += len(resp.read1(65536))
        assert got >= 16 * 65536 - LINE_CAP
        assert time.monotonic() - t0 < 3  # (the upstream is silent for 5 s after)
    finally:
        conn.close()
    honest_call(env)


def test_absurd_usage_is_clamped(env: Env) -> None:
    status, _ = _post(env, _chat("usage"))
    assert status == 200
    row = env.keys.usage[("k1", "usage")]
    assert row[0] == MAX_TOKENS_PER_REQUEST and row[1] == 0


def test_an_abandoned_stream_is_billed_from_what_was_relayed(env: Env) -> None:
    s = _connect(env)
    body = _chat("slow", stream=True)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
              + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    got = b""
    while got.count(b"data:") < 10:
        got += s.recv(65536)
    s.close()  # gone mid-stream, before any usage chunk
    # Billed once the front notices the close and stops the upstream: asynchronous.
    deadline = time.monotonic() + 30
    while ("k1", "slow") not in env.keys.usage:
        assert time.monotonic() < deadline, f"the abandoned stream was not billed: {env.keys.usage}"
        time.sleep(0.05)
    row = env.keys.usage[("k1", "slow")]
    assert row[0] >= 1
    assert 10 <= row[1] <= env.hostile.slow_sent
    assert env.hostile.slow_sent < 400  # the upstream was stopped too
    honest_call(env)


def test_connection_cap_per_process(env: Env) -> None:
    """A second front on the same ingress with a process-wide cap of 3: the 4th connection
    gets 503 and is closed; once one closes, a new one is served again."""
    small = FastFront(env.front.ingress, limits=FrontLimits(max_connections=3))

    async def start() -> int:
        return await small.start("127.0.0.1", 0)

    port = env.lt.call(start)
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            assert _status(_read_all(extra)) == 503
        assert small.refused_connections == 1
        held.pop().close()
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
            again.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                          + KEY.encode() + b"\r\nConnection: close\r\n\r\n")
            assert _status(_read_all(again)) == 200
    finally:
        for s in held:
            s.close()
        env.lt.call(small.aclose)


def test_expect_continue_waits_for_the_key(env: Env) -> None:
    """No `100 Continue` invites the body of a request whose key is unknown; a valid key
    gets it and is served."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\nAuthorization: Bearer %b\r\n\r\n")
    with _connect(env) as s:
        s.sendall(head % (len(_chat()), b"sk-nope"))
        raw = _read_all(s)
    assert _status(raw) == 401 and b"100 Continue" not in raw
    with _connect(env) as s:
        s.sendall(head % (len(_chat()), KEY.encode()))
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(_chat())
        assert _status(s.recv(65536)) == 200


@pytest.mark.parametrize("value", ["true", 1, {"on": True}])
def test_a_stream_flag_that_is_not_a_boolean_is_refused(env: Env, value: object) -> None:
    """An engine may read "true" or 1 as true and stream while the ingress, reading no
    stream, took the body path: it found no usage and billed nothing."""
    before = dict(env.keys.usage)
    for path, body in (("/v1/chat/completions", _chat(stream=value)),
                       ("/v1/responses", orjson.dumps({"model": "m", "input": "hi",
                                                        "stream": value})),
                       ("/v1/messages", orjson.dumps({
                           "model": "m", "max_tokens": 5, "stream": value,
                           "messages": [{"role": "user", "content": "hi"}]}))):
        status, data = _post(env, body, path=path)
        assert status == 400, (path, data)
        err = orjson.loads(data)["error"]
        if path == "/v1/messages":  # (Anthropic's shape)
            assert err["type"] == "invalid_request_error" and "stream" in err["message"]
        else:
            assert err["code"] == "invalid_stream" and err["param"] == "stream"
    assert env.keys.usage == before  # nothing was served
    honest_call(env)


def test_a_client_cannot_send_a_kv_handle(env: Env) -> None:
    """`kv_transfer_params` is vLLM's disaggregation handle: a client's `do_remote_prefill`
    made an engine skip prefill and wait for a KV that never came (220 s at the largest
    size), and `do_remote_decode` made it hand out its own KV handle. Only the fabric's
    two-phase path sets it."""
    before = dict(env.keys.usage)
    for params in ({"do_remote_prefill": True, "remote_engine_id": "x", "kv_bytes": 10**10},
                   {"do_remote_decode": True}):
        doc = orjson.loads(_chat())
        doc["kv_transfer_params"] = params
        status, data = _post(env, orjson.dumps(doc))
        assert status == 400, data
        err = orjson.loads(data)["error"]
        assert err["code"] == "invalid_kv_transfer_params"
        assert err["param"] == "kv_transfer_params"
    assert env.keys.usage == before
    honest_call(env)


def test_a_model_name_no_record_can_carry_is_refused(env: Env) -> None:
    """A 1 MiB model name (answered 404) was kept in the trace ring, the OTLP queue and the
    route cache: 300 requests held 300 MiB in each."""
    doc = orjson.loads(_chat())
    doc["model"] = "m" * 100_000
    status, data = _post(env, orjson.dumps(doc))
    assert status == 400 and orjson.loads(data)["error"]["code"] == "invalid_model"
    honest_call(env)


def _with_nested(body: bytes, depth: int) -> bytes:
    """`body` (a JSON object) with a field "x" nested `depth` arrays deep (written by hand:
    orjson itself writes no deeper than 254)."""
    return body[:-1] + b',"x":' + b"[" * depth + b"0" + b"]" * depth + b"}"


def test_json_nested_past_the_limit_is_400_on_every_path(env: Env) -> None:
    """orjson reads 1,024 levels but writes 254: a body between the two failed with a 500
    (or a cut connection) wherever the ingress re-serialises it."""
    messages = orjson.dumps({"model": "m", "max_tokens": 5,
                             "messages": [{"role": "user", "content": "hi"}]})
    for path, body in (("/v1/chat/completions", _chat(stream=True)),
                       ("/v1/chat/completions", _chat()),
                       ("/v1/responses", orjson.dumps({"model": "m", "input": "hi"})),
                       ("/v1/messages", messages)):
        status, data = _post(env, _with_nested(body, 300), path=path)
        assert status == 400, (path, data)
        assert b"nests arrays and objects more than 128 deep" in data
    status, _ = _post(env, _with_nested(_chat(), 100))  # deep, within the limit: served
    assert status == 200
    honest_call(env)


@pytest.mark.parametrize("body", [
    {"system": [{"type": "text", "text": 5}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                  "content": [{"type": "text",
                                                               "text": None}]}]}]},
])
def test_anthropic_text_that_is_not_a_string_is_400(env: Env, body: dict[str, object]) -> None:
    doc = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
           **body}
    status, data = _post(env, orjson.dumps(doc), path="/v1/messages")
    assert status == 400, data
    err = orjson.loads(data)
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "must be a string" in err["error"]["message"]


def test_pipelined_bodies_behind_an_unread_stream_are_bounded_in_bytes(env: Env) -> None:
    """A stream the client never reads holds the connection's runner; the requests pipelined
    behind it wait in its queue. They are bounded by their bytes (about one max-size body),
    not only by their count (32 x 8 MiB would be 256 MiB per connection)."""
    s = _connect(env)
    try:
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + KEY.encode() + b"\r\n")
        first = _chat("slow", stream=True)
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(first) + first)
        big = _chat(pad="p" * (768 * 1024))
        one = head + b"Content-Length: %d\r\n\r\n" % len(big) + big
        s.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        while sent < 30 * len(one) and time.monotonic() < deadline:
            try:
                sent += s.send(one[sent % len(one):])
            except BlockingIOError:
                time.sleep(0.01)
        [conn] = [c for c in env.front._conns if c.queued_bytes]
        cap = conn.max_queued_bytes
        assert cap == env.front.max_body
        assert conn.reading_paused and cap <= conn.queued_bytes <= cap + len(big)
        assert sent > cap + len(big)  # more was sent than is queued: the bound held it
    finally:
        s.close()
    honest_call(env)


def test_a_bug_while_serving_is_a_logged_json_500(env: Env,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the request path: the client gets a JSON 500 (it used to see the connection
    cut with nothing logged), the log names it, and the next client is served."""
    ingress = env.front.ingress

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom in serve")

    ingress.serve = broken  # type: ignore[method-assign]
    try:
        with caplog.at_level("ERROR", logger="llmfabric.front.fast_front"):
            status, data = _post(env, _chat())
    finally:
        del ingress.serve
    assert status == 500
    assert orjson.loads(data)["error"]["code"] == "internal_error"
    assert "serving a request from 127.0.0.1 failed" in caplog.text
    assert "boom in serve" in caplog.text
    honest_call(env)


def test_messages_api_errors_before_routing_keep_anthropics_shape(env: Env) -> None:
    """Refusals the front answers itself (a head too large, a wrong method) carry the
    Messages API's error shape on /v1/messages, as its translated refusals do."""
    s = _connect(env)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000
              + b"\r\n\r\n")
    raw = _read_all(s)
    s.close()
    assert _status(raw) == 431
    assert orjson.loads(raw.split(b"\r\n\r\n", 1)[1])["type"] == "error"
    conn = http.client.HTTPConnection("127.0.0.1", env.port, timeout=10)
    try:
        conn.request("GET", "/v1/messages", headers={"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        body = orjson.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 405 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"


def test_a_bug_hit_on_every_request_is_logged_at_the_1st_2nd_4th_time(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """A client repeating a request that hits a bug gets its 500 each time, each counted
    (llmfabric_ingress_errors{code=internal_error}), but the log gets the 1st, 2nd, 4th,
    8th... of them (the first with its traceback), not one line per request."""
    ingress = env.front.ingress

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom again")

    before = ingress.metrics.errors.get(("500", "internal_error"), 0)
    ingress.serve = broken  # type: ignore[method-assign]
    try:
        with caplog.at_level("ERROR", logger="llmfabric.front.fast_front"):
            statuses = [_post(env, _chat())[0] for _ in range(8)]
    finally:
        del ingress.serve
    assert statuses == [500] * 8
    after = ingress.metrics.errors[("500", "internal_error")]
    assert after == before + 8
    logged = [r for r in caplog.records if "boom again" in r.getMessage()]
    assert len(logged) == sum(log_due(n) for n in range(before + 1, after + 1)) < 8
    honest_call(env)


def test_a_failing_key_store_is_a_counted_401_logged_without_a_flood(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """The front's early key check refuses a key the store failed on (as the core would),
    counts it (llmfabric_ingress_key_check_errors) and logs the 1st, 2nd, 4th... failure:
    any client can send keys while the store is down."""
    keys = env.keys

    async def down(token: str) -> None:
        raise ConnectionError("key store down")

    keys.authenticate = down  # type: ignore[method-assign,assignment]
    statuses = []
    try:
        with caplog.at_level("ERROR", logger="llmfabric.front.key_precheck"):
            for i in range(5):
                conn = http.client.HTTPConnection("127.0.0.1", env.port, timeout=10)
                try:
                    conn.request("POST", "/v1/chat/completions", body=_chat(),
                                 headers={"Authorization": f"Bearer sk-unseen-{i}"})
                    statuses.append(conn.getresponse().status)
                finally:
                    conn.close()
    finally:
        del keys.authenticate
    assert statuses == [401] * 5
    assert env.front.ingress.metrics.key_check_errors == 5
    logged = [r for r in caplog.records if "checking an API key" in r.getMessage()]
    assert len(logged) == 3 and "ConnectionError('key store down')" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info
    honest_call(env)
