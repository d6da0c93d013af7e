"""`X-Session-Id` through the real fast front: the `session` policy keys on it before
metadata.session_id and `user`, on every OpenAI route and the translated ones; hostile values
(oversized, non-ASCII, control characters) are refused with 400 `invalid_session_id` and
raw CR/LF never gets past the HTTP parser. Real sockets on loopback, mock engines."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from llmfabric.forward import HttpForwarder
from llmfabric.front.fast_front import FastFront
from llmfabric.ingress import Ingress, IngressConfig, StaticCandidateSource
from llmfabric.net.ports import free_port
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing.candidates import Candidate

from ._sdk_clients import tracked
from .test_ingress_support import Backend, LoopThread, serve, wait_port

NODES = 4


def _cand(sid: str, port: int) -> Candidate:
    return Candidate(
        session_id=sid, peer_id="", provider_id="p", http_addr=f"127.0.0.1:{port}", relays=(),
        hardware=Hardware(gpu_model="H100", gpu_count=1), model=ServedModel("m"),
        load=LoadHints(),
    )


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    lt = LoopThread()
    ports = [free_port() for _ in range(NODES)]
    runners = [lt.call(lambda p=p, i=i: serve(Backend(f"b{i}").app(), p))
               for i, p in enumerate(ports)]
    forwarder = HttpForwarder()
    ingress = Ingress(IngressConfig(policy="session", max_retries=0, auth_enabled=False),
                      StaticCandidateSource([_cand(f"node-{i}", p) for i, p in enumerate(ports)]),
                      forwarder)
    ff = FastFront(ingress)

    async def start() -> int:
        return await ff.start("127.0.0.1", 0)

    port = lt.call(start)
    wait_port(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        lt.call(ff.aclose)
        lt.call(forwarder.aclose)
        for r in runners:
            lt.call(r.cleanup)
        lt.stop()


class _Client:
    """Keep-alive JSON POSTs over http.client: (status, headers, body)."""

    def __init__(self, base: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]),
                                               timeout=20)

    def post(self, path: str, headers: dict[str, str], doc: dict[str, Any]
             ) -> tuple[int, dict[str, str], bytes]:
        self.conn.request("POST", path, orjson.dumps(doc),
                          {"Content-Type": "application/json", **headers})
        r = self.conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self) -> None:
        self.conn.close()


def _node(c: _Client, headers: dict[str, str], **body: object) -> str:
    status, h, data = c.post("/v1/chat/completions", headers, {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    assert status == 200, data
    return h["x-fabric-node"]


def test_header_is_the_session_key_before_metadata_and_user(base: str) -> None:
    c = tracked(_Client(base))
    for sid in (f"conv-{i}" for i in range(6)):
        nodes = {_node(c, {"X-Session-Id": sid}, user=f"u{j}",
                       metadata={"session_id": f"meta-{j}"}) for j in range(5)}
        assert len(nodes) == 1, (sid, nodes)  # the header wins over body keys
    # Without the header the body keys decide, and different keys spread.
    assert len({_node(c, {}, user=f"user-{i}") for i in range(24)}) >= 2
    # The same key by header or by metadata.session_id lands on the same node.
    for sid in ("same-a", "same-b", "same-c"):
        assert _node(c, {"X-Session-Id": sid}) == _node(c, {}, metadata={"session_id": sid})
    # Blank header: ignored (the body's key applies).
    assert (_node(c, {"X-Session-Id": "  "}, user="same-a")
            == _node(c, {"X-Session-Id": "same-a"}))


def test_translated_routes_read_the_header(base: str) -> None:
    c = tracked(_Client(base))
    for sid in ("anthro-1", "anthro-2", "anthro-3"):
        want = _node(c, {"X-Session-Id": sid})
        for _ in range(3):
            status, h, data = c.post("/v1/messages", {"X-Session-Id": sid}, {
                "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
            assert status == 200, data
            assert h["x-fabric-node"] == want


@pytest.mark.parametrize(("value", "code"), [
    (b"x" * 257, b"invalid_session_id"),  # oversized: refused, not truncated
    (b"caf\xc3\xa9", b"invalid_session_id"),  # non-ASCII
    (b"tab\there", b"invalid_session_id"),  # (llhttp lets HTAB through; the core does not)
    (b"a\x01b", b"bad_request"),  # other control characters: malformed for llhttp
    (b"a\rInjected: 1", b"bad_request"),  # a bare CR never reaches the core
])
def test_hostile_values_are_refused(base: str, value: bytes, code: bytes) -> None:
    status, body = _raw(base, b"X-Session-Id: " + value + b"\r\n")
    assert status == 400
    assert code in body


def _raw(base: str, extra: bytes) -> tuple[int, bytes]:
    port = int(base.rsplit(":", 1)[1])
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\n"
           + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data
