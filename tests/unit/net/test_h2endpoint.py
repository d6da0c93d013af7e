"""H2Endpoint (net/h2endpoint.py), sans-IO: two endpoints wired back to back in memory (each
one's emitted bytes fed to the other on the next loop iteration). Requests and responses
with bodies larger than the flow-control windows, a request body that fails mid-way, resets
either way (a response to a stream the caller reset closes its body unsent), and hostile
bytes (not HTTP/2, a second session preface) that kill the session:
every open stream fails with RequestFailed and `on_dead` tells the connection to close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llmfabric.net.errors import RequestFailed
from llmfabric.net.h2endpoint import CONNECTION_WINDOW, STREAM_WINDOW, H2Endpoint
from llmfabric.net.messages import BodyStream, Headers
from llmfabric.testing.poll import wait_until

BIG = 2 * CONNECTION_WINDOW + 12345  # more than both windows: flow control must move it


class Wired:
    """A client endpoint and a server endpoint talking to each other."""

    def __init__(self, *, serve: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self.dead: list[str] = []
        self.resets: list[int] = []
        self.requests: list[tuple[int, Headers, BodyStream]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.serve = serve
        self.client = H2Endpoint(
            client_side=True, emit=lambda b: loop.call_soon(self.server.feed, b),
            drain=_nothing, on_dead=lambda: self.dead.append("client"))
        self.server = H2Endpoint(
            client_side=False, emit=lambda b: loop.call_soon(self.client.feed, b),
            drain=_nothing, on_request=self._on_request, on_reset=self.resets.append,
            on_dead=lambda: self.dead.append("server"))
        self.client.start()
        self.server.start()

    def _on_request(self, sid: int, headers: Headers, body: BodyStream) -> None:
        self.requests.append((sid, headers, body))
        if self.serve:
            self.tasks.append(asyncio.ensure_future(self._echo(sid, headers, body)))

    async def _echo(self, sid: int, headers: Headers, body: BodyStream) -> None:
        data = await body.read()
        path = dict(headers)[":path"]
        await self.server.respond(sid, 200, (("x-path", path), ("x-len", str(len(data)))),
                                  data[::-1])


async def _nothing() -> None:
    return None


async def test_a_request_and_its_response_cross_the_flow_control_windows() -> None:
    w = Wired()
    body = bytes(range(256)) * (BIG // 256)
    status, headers, stream, _ = await asyncio.wait_for(
        w.client.request("POST", "/echo", "peer", (("X-Trace", "t1"),), body), 10)
    assert status == 200 and dict(headers) == {"x-path": "/echo", "x-len": str(len(body))}
    assert await asyncio.wait_for(stream.read(), 10) == body[::-1]
    _, got_headers, _ = w.requests[0]
    assert ("x-trace", "t1") in got_headers  # header names travel lower-cased
    await wait_until(lambda: w.client.open_streams == 0 == w.server.open_streams)
    assert not w.dead


async def test_a_streamed_request_body_that_fails_resets_the_stream() -> None:
    w = Wired(serve=False)

    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * STREAM_WINDOW
        raise OSError("the disk went away")

    with pytest.raises(RequestFailed, match="sending the request body failed"):
        await asyncio.wait_for(w.client.request("POST", "/up", "peer", (), failing()), 10)
    await wait_until(lambda: w.resets, what="the server hears the reset")
    sid, _, server_body = w.requests[0]
    assert w.resets == [sid]
    with pytest.raises(RequestFailed, match="reset"):
        await asyncio.wait_for(server_body.read(), 10)
    assert not w.dead and w.client.open_streams == 0


async def test_a_server_reset_fails_the_waiting_request() -> None:
    w = Wired(serve=False)
    call = asyncio.ensure_future(w.client.request("GET", "/never", "peer", (), b""))
    await wait_until(lambda: w.requests)
    w.server.reset_stream(w.requests[0][0])
    with pytest.raises(RequestFailed, match="reset by peer"):
        await asyncio.wait_for(call, 10)
    assert w.server.open_streams == 0 and not w.dead


class ClosableBody:
    """A response body that records being closed (it stands for an engine stream)."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> ClosableBody:
        return self

    async def __anext__(self) -> bytes:
        return b"x"

    async def aclose(self) -> None:
        self.closed = True


async def test_a_response_to_a_stream_the_caller_reset_closes_its_body_unsent() -> None:
    w = Wired(serve=False)
    call = asyncio.ensure_future(w.client.request("GET", "/slow", "peer", (), b""))
    await wait_until(lambda: w.requests)
    call.cancel()  # the caller gives up: its endpoint resets the stream
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_until(lambda: w.resets, what="the server hears the reset")
    body = ClosableBody()
    await w.server.respond(w.requests[0][0], 200, (), body)
    assert body.closed  # (it may hold an engine connection and an in-flight count)


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x",  # DATA on stream 0
    b"\x00\x00\x04\x09\x00\x00\x00\x00\x01abcd",  # a CONTINUATION frame out of the blue
    b"\x00\x00\x05\x04\x00\x00\x00\x00\x00abcde",  # SETTINGS of a length no setting has
    b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00",  # a zero WINDOW_UPDATE
])
async def test_hostile_bytes_kill_the_session_and_fail_its_streams(garbage: bytes) -> None:
    w = Wired(serve=False)
    call = asyncio.ensure_future(w.client.request("GET", "/slow", "peer", (), b""))
    await wait_until(lambda: w.requests)
    w.client.feed(garbage)
    assert w.dead == ["client"]
    with pytest.raises(RequestFailed, match="protocol error"):
        await asyncio.wait_for(call, 10)
    assert w.client.open_streams == 0
    with pytest.raises(RequestFailed, match="connection closed"):
        await w.client.request("GET", "/after", "peer", (), b"")


async def test_a_lost_connection_fails_every_stream_once() -> None:
    w = Wired(serve=False)
    hold = asyncio.Event()

    async def upload() -> AsyncIterator[bytes]:  # a request body still flowing
        yield b"part"
        await hold.wait()

    calls = [asyncio.ensure_future(w.client.request("POST", f"/{i}", "peer", (), upload()))
             for i in range(3)]
    await wait_until(lambda: len(w.requests) == 3)
    bodies = [body for _, _, body in w.requests]
    lost = RequestFailed("the connection dropped")
    w.client.fail(lost)
    w.server.fail(lost)
    w.client.fail(RequestFailed("a second failure changes nothing"))
    for call in calls:
        with pytest.raises(RequestFailed, match="the connection dropped"):
            await asyncio.wait_for(call, 10)
    for body in bodies:
        with pytest.raises(RequestFailed, match="the connection dropped"):
            await asyncio.wait_for(body.read(), 10)
    await w.server.respond(w.requests[0][0], 200, (), b"late")  # a no-op, not a crash
    assert w.client.open_streams == w.server.open_streams == 0
