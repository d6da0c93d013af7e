"""One HTTP/2 session (sans-IO `h2`) carried inside a peer connection's frames.

Every connection holds two sessions, so either side can send requests: the local *client*
session (its bytes travel as H2_TO_SERVER frames) and the local *server* session (H2_TO_CLIENT).
On a relay connection opened by a NATed node, the relay uses its client session and the NATed
node answers with its server session: HTTP/2 with roles reversed on the outbound connection.

What a peer can make a session buffer is bounded by the settings we advertise and checked as
bytes arrive (h2limits.py); a peer over a limit gets GOAWAY and its connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from llmfabric.net.errors import RequestFailed
from llmfabric.net.h2limits import (
    CONNECTION_WINDOW,
    MAX_FRAME,
    MAX_HEADER_LIST,
    STREAM_WINDOW,
    FrameGate,
    H2LimitError,
)
from llmfabric.net.messages import Body, BodyStream, Headers
from llmfabric.untrusted import get_logger

__all__ = ["CONNECTION_WINDOW", "STREAM_WINDOW", "H2Endpoint"]

log = get_logger(__name__)
MAX_EMIT = 256 * 1024

Emit = Callable[[bytes], object]
Drain = Callable[[], Awaitable[None]]
# server side: (stream id, headers, body stream) -> None; the callee answers with respond().
OnRequest = Callable[[int, Headers, BodyStream], None]


class _Stream:
    """One open stream. Only a stream this side opened (client role) has a `response` future,
    and `request()` always awaits it; a served stream has none, so a reset or a lost
    connection never leaves a future whose exception nobody retrieves."""

    __slots__ = ("body", "reset", "response", "window")

    def __init__(self, body: BodyStream, response: asyncio.Future[Headers] | None) -> None:
        self.body = body
        self.window = asyncio.Event()
        self.response = response
        self.reset = False

    def fail(self, err: BaseException) -> None:
        self.reset = True
        self.body.push(err)
        self.window.set()
        if self.response is not None and not self.response.done():
            self.response.set_exception(err)


class H2Endpoint:
    def __init__(
        self,
        *,
        client_side: bool,
        emit: Emit,
        drain: Drain,
        on_request: OnRequest | None = None,
        on_reset: Callable[[int], None] | None = None,
        on_dead: Callable[[], None] | None = None,
        name: str = "",
    ) -> None:
        config = h2.config.H2Configuration(
            client_side=client_side,
            header_encoding="utf-8",
            validate_inbound_headers=True,
            validate_outbound_headers=False,  # we build them; saves ~10% per request
        )
        self._conn = h2.connection.H2Connection(config=config)
        self._gate = FrameGate(preface=not client_side)
        self._name = name  # the peer, for logs
        self._emit = emit
        self._drain = drain
        self._on_request = on_request
        self._on_reset = on_reset
        self._on_dead = on_dead  # the session failed: the carrying connection must close
        self._streams: dict[int, _Stream] = {}
        self._closed: BaseException | None = None

    def start(self) -> None:
        self._conn.initiate_connection()
        codes = h2.settings.SettingCodes
        self._conn.update_settings({codes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                                    codes.MAX_FRAME_SIZE: MAX_FRAME,
                                    codes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
        self._conn.increment_flow_control_window(CONNECTION_WINDOW)
        self._flush()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        for i in range(0, len(data), MAX_EMIT):
            self._emit(data[i : i + MAX_EMIT])

    # -- incoming bytes ----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self._closed is not None:
            return  # (the session failed: nothing more is read)
        try:
            self._gate.check(data)  # before h2 buffers anything (h2limits.py)
        except H2LimitError as exc:
            code = h2.errors.ErrorCodes.FRAME_SIZE_ERROR
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._conn.close_connection(code, additional_data=str(exc)[:200].encode())
            self._kill(RequestFailed(str(exc)))
            return
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._kill(RequestFailed(f"HTTP/2 protocol error from peer: {exc}"))
            return
        for ev in events:
            self._handle(ev)
        self._flush()

    def _kill(self, err: RequestFailed) -> None:
        """The peer broke the protocol or a limit: tell it (GOAWAY), fail every stream, and
        have the carrying connection closed."""
        log.warning("closing the HTTP/2 session with peer %s: %s", self._name[:16] or "?", err)
        self._flush()
        self.fail(err)
        if self._on_dead is not None:
            self._on_dead()

    def _handle(self, ev: h2.events.Event) -> None:
        st: _Stream | None
        if isinstance(ev, h2.events.RequestReceived) and self._on_request is not None:
            sid = ev.stream_id
            new = _Stream(self._body_stream(sid), None)
            self._streams[sid] = new
            self._on_request(sid, _headers(ev.headers), new.body)
        elif isinstance(ev, h2.events.ResponseReceived):
            st = self._streams.get(ev.stream_id)
            if st is not None and st.response is not None and not st.response.done():
                st.response.set_result(_headers(ev.headers))
        elif isinstance(ev, h2.events.DataReceived):
            st = self._streams.get(ev.stream_id)
            if st is None:
                self._conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            else:
                st.body.push((ev.data, ev.flow_controlled_length))
        elif isinstance(ev, h2.events.StreamEnded):
            st = self._streams.get(ev.stream_id)
            if st is not None:
                st.body.push(None)
                self._maybe_forget(ev.stream_id)
        elif isinstance(ev, h2.events.StreamReset):
            st = self._streams.pop(ev.stream_id, None)
            if self._on_reset is not None:
                self._on_reset(ev.stream_id)
            if st is not None:
                st.fail(RequestFailed(f"stream reset by peer (code {ev.error_code})"))
        elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for st in self._streams.values():
                st.window.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.fail(RequestFailed(f"peer ended the HTTP/2 session (code {ev.error_code})"))
            if self._on_dead is not None:
                self._on_dead()

    def _maybe_forget(self, sid: int) -> None:
        stream = self._conn.streams.get(sid)
        if stream is None or stream.closed:
            self._streams.pop(sid, None)

    def _body_stream(self, sid: int) -> BodyStream:
        def ack(n: int) -> None:
            if self._closed is None and n:
                try:
                    self._conn.acknowledge_received_data(n, sid)
                except h2.exceptions.ProtocolError:
                    return
                self._flush()

        def abort() -> None:
            self.reset_stream(sid)

        return BodyStream(ack, abort)

    def fail(self, err: BaseException) -> None:
        """The carrying connection is gone: fail every stream."""
        if self._closed is not None:
            return
        self._closed = err
        for st in self._streams.values():
            st.fail(err)
        self._streams.clear()

    def reset_stream(self, sid: int, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
        st = self._streams.pop(sid, None)
        if st is not None:
            st.reset = True
            st.window.set()
        if self._closed is None:
            try:
                self._conn.reset_stream(sid, code)
            except h2.exceptions.ProtocolError:
                return
            self._flush()

    # -- client side -------------------------------------------------------------------------
    async def request(
        self, method: str, path: str, authority: str, headers: Headers, body: Body
    ) -> tuple[int, Headers, BodyStream, int]:
        """Send a request; return (status, headers, body stream, stream id) at response headers.

        The request body is sent by a background task so a response may stream while the
        request body still flows.
        """
        if self._closed is not None:
            raise RequestFailed(f"connection closed: {self._closed}")
        sid = self._conn.get_next_available_stream_id()
        response: asyncio.Future[Headers] = asyncio.get_running_loop().create_future()
        st = _Stream(self._body_stream(sid), response)
        self._streams[sid] = st
        hdrs = [
            (":method", method),
            (":scheme", "https"),
            (":authority", authority),
            (":path", path),
            *((k.lower(), v) for k, v in headers),
        ]
        empty = isinstance(body, bytes) and not body
        self._conn.send_headers(sid, hdrs, end_stream=empty)
        self._flush()
        sender: asyncio.Task[None] | None = None
        if not empty:
            sender = asyncio.ensure_future(self._send_request_body(sid, body))
            sender.add_done_callback(_consume_exc)  # before anything can fail
        try:
            resp = await response
        except BaseException:
            if sender is not None:
                sender.cancel()
            self.reset_stream(sid)
            raise
        status = 0
        rest: list[tuple[str, str]] = []
        for k, v in resp:
            if k == ":status":
                status = int(v)
            elif not k.startswith(":"):
                rest.append((k, v))
        return status, tuple(rest), st.body, sid

    async def _send_request_body(self, sid: int, body: Body) -> None:
        """Send a request body; if the caller's body iterator fails, reset the stream so
        the peer (and our waiting caller) learn it at once."""
        try:
            await self.send_body(sid, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # (the body's own failure: the waiting caller gets it)
            st = self._streams.get(sid)
            self.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            if st is not None:
                st.fail(RequestFailed(f"sending the request body failed: {exc!r}"))

    # -- server side -------------------------------------------------------------------------
    async def respond(self, sid: int, status: int, headers: Headers, body: Body) -> None:
        """Send the response headers and stream the body; stops quietly on a reset (the body
        is closed in every case: it may hold an engine connection)."""
        st = self._streams.get(sid)
        if st is None or self._closed is not None:
            await _close_body(body)
            return
        empty = isinstance(body, bytes) and not body
        hdrs = [(":status", str(status)), *((k.lower(), v) for k, v in headers)]
        try:
            self._conn.send_headers(sid, hdrs, end_stream=empty)
        except h2.exceptions.ProtocolError:
            await _close_body(body)
            return
        self._flush()
        if empty:
            self._maybe_forget(sid)
        else:
            await self.send_body(sid, body)

    async def send_body(self, sid: int, body: Body) -> None:
        st = self._streams.get(sid)
        if st is None:
            await _close_body(body)
            return
        chunks: AsyncIterable[bytes] = _one(body) if isinstance(body, bytes) else body
        try:
            async for chunk in chunks:
                if not await self._send_chunk(sid, st, chunk):
                    return
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:  # stop an upstream generator (e.g. a relayed stream)
                await aclose()
        if st.reset or self._closed is not None:
            return
        try:
            self._conn.end_stream(sid)
        except h2.exceptions.ProtocolError:
            return
        self._flush()
        self._maybe_forget(sid)

    async def _send_chunk(self, sid: int, st: _Stream, chunk: bytes) -> bool:
        view = memoryview(chunk)
        while view:
            if st.reset or self._closed is not None:
                return False
            try:
                window = min(
                    self._conn.local_flow_control_window(sid), self._conn.max_outbound_frame_size
                )
            except h2.exceptions.ProtocolError:  # the stream closed under us
                return False
            if window <= 0:
                st.window.clear()
                await st.window.wait()
                continue
            n = min(window, len(view))
            try:
                self._conn.send_data(sid, bytes(view[:n]))
            except h2.exceptions.ProtocolError:
                return False
            self._flush()
            view = view[n:]
        await self._drain()
        return True


async def _one(data: bytes) -> AsyncIterable[bytes]:
    yield data


async def _close_body(body: Body) -> None:
    """Stop a body that will not be sent (an upstream generator, an engine stream)."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


def _consume_exc(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _headers(raw: Sequence[Any] | None) -> Headers:
    out: list[tuple[str, str]] = []
    for k, v in raw or []:
        out.append(
            (k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
        )
    return tuple(out)
