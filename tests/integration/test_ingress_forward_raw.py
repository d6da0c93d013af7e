"""RawHttpForwarder on real loopback sockets against scripted HTTP/1.1 servers: Content-Length
and chunked responses, keep-alive reuse only after a complete response, nodes closing
mid-response or while idle, close-delimited bodies, per-phase timeouts and large bodies read
slowly (reading from the node pauses and resumes)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmfabric.forward.raw import RawHttpForwarder
from llmfabric.ingress import IngressConfig, StaticCandidateSource, Timeouts, UpstreamError
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import UpstreamBusyError, UpstreamConnectError
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
FAST = Timeouts(connect=2.0, first_byte=2.0, idle=2.0, total=5.0)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b"
            b"\r\n%b" % (len(body), extra, body))


def chunked(*parts: bytes) -> bytes:
    out = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    return out + b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class Server:
    """Answers each request with `script(reader, writer, body)`; the script returns whether
    the connection stays open. Counts connections and requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await r.readexactly(length)
                self.requests.append(body)
                if not await self.script(r, w, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def cand(self) -> Candidate:
        return Candidate("n1", "peer-n1", "p", f"127.0.0.1:{self.port}", (), Hardware("H100", 1),
                         ServedModel("m"), LoadHints())


@contextlib.asynccontextmanager
async def forwarder() -> AsyncIterator[RawHttpForwarder]:
    f = RawHttpForwarder()
    try:
        yield f
    finally:
        await f.aclose()


async def fetch(f: RawHttpForwarder, c: Candidate, body: bytes = b"{}",
                t: Timeouts = FAST) -> tuple[int, str, bytes]:
    up = await f.open(c, "/v1/chat/completions", body, t)
    try:
        return up.status, up.content_type, await up.read()
    finally:
        await up.aclose()


async def test_content_length_response_and_keep_alive_reuse() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(b'{"echo":' + body + b"}"))
        return True

    async with Server(script) as s, forwarder() as f:
        for i in range(3):
            status, ctype, data = await fetch(f, s.cand, b'{"i":%d}' % i)
            assert (status, ctype) == (200, "application/json")
            assert data == b'{"echo":{"i":%d}}' % i
        assert s.connections == 1  # one pooled keep-alive connection served all three


async def test_chunked_response_is_dechunked_chunk_by_chunk_then_reused() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        head, _, rest = chunked(b"data: a\n\n", b"data: bb\n\n").partition(b"\r\n\r\n")
        w.write(head + b"\r\n\r\n")
        await w.drain()
        for piece in (rest[:5], rest[5:12], rest[12:]):  # chunk framing split across writes
            await asyncio.sleep(0.01)
            w.write(piece)
            await w.drain()
        return True

    async with Server(script) as s, forwarder() as f:
        for _ in range(2):
            up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
            assert up.content_type == "text/event-stream"
            got = [c async for c in up.chunks()]
            await up.aclose()
            assert b"".join(got) == b"data: a\n\ndata: bb\n\n"
        assert s.connections == 1


async def test_pipelined_responses_on_one_connection_are_not_confused() -> None:
    """Two complete responses back to back: the second request gets its own answer."""
    n = 0

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        nonlocal n
        n += 1
        w.write(ok(b'{"n":%d}' % n) if n % 2 else chunked(b'{"n":', b"%d}" % n))
        return True

    async with Server(script) as s, forwarder() as f:
        bodies = [(await fetch(f, s.cand))[2] for _ in range(4)]
        assert bodies == [b'{"n":1}', b'{"n":2}', b'{"n":3}', b'{"n":4}']
        assert s.connections == 1


async def test_node_closing_mid_response_raises_and_the_connection_is_dropped() -> None:
    calls = 0

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
            await w.drain()
            return False  # close mid-body
        w.write(ok(b"{}"))
        return True

    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/completions", b"{}", FAST)
        with pytest.raises(UpstreamError, match="mid-response"):
            await up.read()
        await up.aclose()
        assert (await fetch(f, s.cand))[2] == b"{}"
        assert s.connections == 2


async def test_truncated_chunked_stream_raises() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(chunked(b"data: 1\n\n", b"data: 2\n\n")[:-20])
        await w.drain()
        return False

    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/completions", b"{}", FAST)
        got: list[bytes] = []
        with pytest.raises(UpstreamError):
            async for c in up.chunks():
                got.append(c)
        await up.aclose()
        assert got and got[0] == b"data: 1\n\n"


async def test_close_delimited_body_is_read_to_eof_and_not_reused() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        await w.drain()
        w.write(b'{"a":')
        await w.drain()
        await asyncio.sleep(0.01)
        w.write(b"1}")
        return False

    async with Server(script) as s, forwarder() as f:
        assert (await fetch(f, s.cand))[2] == b'{"a":1}'
        assert (await fetch(f, s.cand))[2] == b'{"a":1}'
        assert s.connections == 2


async def test_no_reuse_after_a_partially_read_response() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        head, _, rest = chunked(b"one", b"two").partition(b"\r\n\r\n")
        w.write(head + b"\r\n\r\n" + rest[:8])  # the first chunk only, for now
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(rest[8:])
        return True

    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
        it = up.chunks().__aiter__()
        assert await it.__anext__() == b"one"
        await up.aclose()  # abandoned mid-response (client went away)
        await asyncio.sleep(0.1)
        assert (await fetch(f, s.cand))[2] == b"onetwo"
        assert s.connections == 2


async def test_idle_connection_closed_by_the_node_is_replaced_transparently() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(b"{}"))
        await w.drain()
        return False  # close right after each answer (without saying Connection: close)

    async with Server(script) as s, forwarder() as f:
        for _ in range(3):
            assert (await fetch(f, s.cand))[0] == 200
            await asyncio.sleep(0.02)
        assert s.connections == 3


async def test_extra_bytes_after_a_response_prevent_reuse() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(b"{}") + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        return True

    async with Server(script) as s, forwarder() as f:
        for _ in range(2):
            assert (await fetch(f, s.cand))[2] == b"{}"
            await asyncio.sleep(0.02)
        assert s.connections == 2


async def test_first_byte_idle_and_total_timeouts() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        if body == b"silent":
            await asyncio.sleep(1)
        elif body == b"stall":
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await w.drain()
            await asyncio.sleep(1)
        else:  # trickle: a chunk every 50 ms, forever
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(40):
                w.write(b"1\r\nx\r\n")
                await w.drain()
                await asyncio.sleep(0.05)
        return False

    t = Timeouts(connect=1.0, first_byte=0.2, idle=0.2, total=0.5)
    async with Server(script) as s, forwarder() as f:
        with pytest.raises(UpstreamError, match="no response within"):
            await fetch(f, s.cand, b"silent", t)
        with pytest.raises(UpstreamError, match="no data for"):
            await fetch(f, s.cand, b"stall", t)
        with pytest.raises(UpstreamError, match="timed out after"):
            await fetch(f, s.cand, b"trickle", t)


async def test_connect_failure_is_an_upstream_error() -> None:
    async with Server(lambda r, w, b: asyncio.sleep(0, True)) as s:
        port = s.port
    async with forwarder() as f:
        c = Candidate("n1", "p", "p", f"127.0.0.1:{port}", (), Hardware("H100", 1),
                      ServedModel("m"), LoadHints())
        with pytest.raises(UpstreamError, match="cannot connect"):
            await fetch(f, c)


async def test_large_body_read_slowly_arrives_intact() -> None:
    big = bytes(range(256)) * 8192  # 2 MiB, more than the pause threshold

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for i in range(0, len(big), 65536):
            w.write(big[i:i + 65536])
            await w.drain()
        return True

    async with Server(script) as s, forwarder() as f:
        for _ in range(2):
            up = await f.open(s.cand, "/v1/completions", b"{}", FAST)
            await asyncio.sleep(0.1)  # let the node fill our buffer: reading pauses
            got = bytearray()
            async for c in up.chunks():
                got += c
                await asyncio.sleep(0)
            await up.aclose()
            assert bytes(got) == big
        assert s.connections == 1


async def test_ingress_retries_a_node_that_closes_before_answering() -> None:
    """Through Ingress.serve: the first node drops every request, the second answers."""

    async def drop(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        return False

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(b'{"usage":{"prompt_tokens":3,"completion_tokens":2}}'))
        return True

    async with Server(drop) as bad, Server(answer) as good, forwarder() as f:
        c_bad = Candidate("bad", "p", "p", f"127.0.0.1:{bad.port}", (), Hardware("H100", 1),
                          ServedModel("m"), LoadHints())
        c_good = Candidate("good", "p", "p", f"127.0.0.1:{good.port}", (), Hardware("H100", 1),
                           ServedModel("m"), LoadHints())
        ing = Ingress(IngressConfig(auth_enabled=False, max_retries=2, timeouts=FAST,
                                    policy="round_robin"),
                      StaticCandidateSource([c_bad, c_good]), f)
        for _ in range(4):
            reply = await ing.serve("/v1/chat/completions", True, "", None, b'{"model":"m"}',
                                    sink=None)  # type: ignore[arg-type]
            assert reply is not None
            assert (reply.status, reply.node) == (200, "good")
        assert bad.requests  # the bad node was tried (and dropped the request) first


def sse_stream(n: int, size: int = 40) -> list[bytes]:
    return [b"data: " + (b"%04d" % i) * (size // 4) + b"\n\n" for i in range(n)]


async def test_relay_pushes_chunks_in_order_and_the_connection_is_reused() -> None:
    parts = sse_stream(50)

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        head, _, rest = chunked(*parts).partition(b"\r\n\r\n")
        w.write(head + b"\r\n\r\n")
        for i in range(0, len(rest), 97):  # framing split at odd places
            w.write(rest[i:i + 97])
            await w.drain()
            await asyncio.sleep(0.001)
        return True

    async def writable() -> None:
        raise AssertionError("never blocked")

    got: list[bytes] = []
    async with Server(script) as s, forwarder() as f:
        for _ in range(2):
            up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
            got.clear()
            await up.relay(lambda d: got.append(d) is None, writable)
            await up.aclose()
            assert b"".join(got) == b"".join(parts)
        assert s.connections == 1


async def test_relay_pauses_for_a_full_client_and_loses_nothing() -> None:
    parts = sse_stream(400, 4000)  # ~1.6 MB

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(chunked(*parts))
        await w.drain()
        return True

    got: list[bytes] = []
    waits = 0

    def push(d: bytes) -> bool:
        got.append(d)
        return len(got) % 7 != 0  # "full" every 7th push

    async def writable() -> None:
        nonlocal waits
        waits += 1
        await asyncio.sleep(0.001)

    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
        await up.relay(push, writable)
        await up.aclose()
        assert b"".join(got) == b"".join(parts)
        assert waits > 10


async def test_relay_reports_a_node_closing_mid_stream_and_a_gone_client() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(chunked(*sse_stream(3))[:-30])  # cut inside the last chunk
        await w.drain()
        await asyncio.sleep(0.05)
        return False

    async def writable() -> None:
        return None

    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
        got: list[bytes] = []
        with pytest.raises(UpstreamError, match="mid-response"):
            await up.relay(lambda d: got.append(d) is None, writable)
        await up.aclose()
        assert got[:2] == sse_stream(3)[:2]

        def gone(d: bytes) -> bool:
            raise ConnectionResetError("the client closed the connection")

        up = await f.open(s.cand, "/v1/chat/completions", b"{}", FAST)
        with pytest.raises(ConnectionResetError):
            await up.relay(gone, writable)
        await up.aclose()
        assert s.connections == 2  # neither connection went back to the pool


async def test_relay_idle_timeout() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await w.drain()
        w.write(b"3\r\ndef\r\n")
        await w.drain()
        await asyncio.sleep(1)
        return False

    async def writable() -> None:
        return None

    t = Timeouts(connect=1.0, first_byte=0.5, idle=0.2, total=5.0)
    async with Server(script) as s, forwarder() as f:
        up = await f.open(s.cand, "/v1/chat/completions", b"{}", t)
        got: list[bytes] = []
        with pytest.raises(UpstreamError, match="no data for"):
            await up.relay(lambda d: got.append(d) is None, writable)
        await up.aclose()
        assert b"".join(got) == b"abcdef"


async def test_fast_front_relays_a_stream_to_a_slow_client_and_reports_a_cut() -> None:
    """End to end through FastFront: a big stream to a client that reads slowly arrives
    intact; a stream the node cuts ends with an error event and a proper chunked end."""
    from llmfabric.front.fast_front import FastFront

    big = sse_stream(2000, 4000)  # 8 MB: more than the kernel's socket buffers hold

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        if b"cut" in body:
            w.write(chunked(*sse_stream(2))[:-5])
            await w.drain()
            return False
        w.write(chunked(*big, b"data: [DONE]\n\n"))
        await w.drain()
        return True

    async with Server(script) as s, forwarder() as f:
        ing = Ingress(IngressConfig(auth_enabled=False, max_retries=0, timeouts=FAST),
                      StaticCandidateSource([s.cand]), f)
        front = FastFront(ing)
        port = await front.start("127.0.0.1", 0)
        try:
            for model in (b"ok", b"cut"):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # (no autotuning)
                sock.connect(("127.0.0.1", port))
                r, w = await asyncio.open_connection(sock=sock)
                body = b'{"model":"m","stream":true,"x":"%b"}' % model
                w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
                head = await r.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head
                await asyncio.sleep(0.2)  # not reading: the ingress's buffers fill up
                data = bytearray()
                n = 0
                while True:  # de-chunk, slowly
                    size = int((await r.readuntil(b"\r\n"))[:-2], 16)
                    chunk = await r.readexactly(size + 2)
                    if size == 0:
                        break
                    data += chunk[:-2]
                    n += 1
                    if model == b"ok" and n % 200 == 0:
                        await asyncio.sleep(0.01)
                w.close()
                if model == b"ok":
                    assert bytes(data) == b"".join(big) + b"data: [DONE]\n\n"
                else:
                    assert bytes(data).startswith(b"".join(sse_stream(2))[:40])
                    assert b"upstream_failed" in data and b"failed mid-stream" in data
        finally:
            await front.aclose()


async def test_fast_front_keep_alive_connection_served_by_one_task_then_idle_closed() -> None:
    """Requests with pauses between them reuse one client connection (its task waits for the
    next request); the idle timeout then closes it and nothing is left behind."""
    from llmfabric.front.fast_front import FastFront

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(b'{"n":1}'))
        return True

    async with Server(script) as s, forwarder() as f:
        ing = Ingress(IngressConfig(auth_enabled=False, timeouts=FAST),
                      StaticCandidateSource([s.cand]), f)
        front = FastFront(ing, idle_timeout_s=0.3)
        port = await front.start("127.0.0.1", 0)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"model":"m"}'
            for _ in range(3):
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
                head = await r.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200") and b"X-Fabric-Node: n1" in head
                assert await r.readexactly(7) == b'{"n":1}'
                await asyncio.sleep(0.05)
            assert len(front._conns) == 1
            assert await asyncio.wait_for(r.read(), 3) == b""  # closed by the idle timeout
            w.close()
            assert not front._conns
        finally:
            await front.aclose()


async def test_a_dial_turn_covers_taking_a_pooled_connection_not_its_exchange() -> None:
    """With one dial at a time per node: R2 waits for its turn and then takes a connection
    that came back to the pool meanwhile (R1's), whose answer takes 1.5 s. R3, arriving with the
    pool empty, dials at once: it must not wait behind R2's exchange (it failed after its
    0.5 s connect timeout when the turn was held through the exchange)."""
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        await asyncio.sleep(1.5 if b"slow" in body else 0.2 if b"mid" in body else 0)
        w.write(ok(body))
        return True

    t = Timeouts(connect=0.5, first_byte=5.0, idle=5.0, total=10.0)
    async with Server(script) as s:
        f = RawHttpForwarder(max_dials_per_node=1)
        try:
            assert (await fetch(f, s.cand, b'{"warm":1}', t))[0] == 200  # one idle conn
            key = s.cand.http_addr
            await f._dials.acquire(key)  # a dial in flight: the turn is taken
            r1 = asyncio.create_task(fetch(f, s.cand, b'{"mid":1}', t))  # the idle conn
            await asyncio.sleep(0.05)
            assert not f._idle.get(key)
            r2 = asyncio.create_task(fetch(f, s.cand, b'{"slow":2}', t))  # pool empty: waits
            assert (await r1)[2] == b'{"mid":1}'  # ...its connection back in the pool
            assert len(f._idle[key]) == 1 and not r2.done()
            f._dials.release(key)  # R2's turn: it takes that connection
            await asyncio.sleep(0.05)
            assert not r2.done() and not f._idle[key]  # R2 took it
            r3 = await asyncio.wait_for(fetch(f, s.cand, b'{"r":3}', t), 1.0)
            assert r3[2] == b'{"r":3}'
            assert (await r2)[2] == b'{"slow":2}'
            assert s.connections == 2 and f._dials.in_flight(key) == 0
        finally:
            await f.aclose()


async def test_a_full_dial_gate_is_a_busy_error_not_a_connect_error() -> None:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(ok(body))
        return True

    async with Server(script) as s:
        f = RawHttpForwarder(max_dials_per_node=1)
        try:
            await f._dials.acquire(s.cand.http_addr)
            with pytest.raises(UpstreamBusyError, match="1 connection attempts"):
                await fetch(f, s.cand, b"{}", Timeouts(connect=0.2, first_byte=1, idle=1,
                                                        total=2))
            assert not issubclass(UpstreamBusyError, UpstreamConnectError)
            assert s.connections == 0
        finally:
            f._dials.release(s.cand.http_addr)
            await f.aclose()
