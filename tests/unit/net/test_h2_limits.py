"""What a hostile peer can make an HTTP/2 session buffer (net/h2limits.py, h2endpoint.py):
a frame header announcing 16 MiB is refused at its 9 bytes (h2 alone buffered the whole
frame before checking its length), a header block past the limit likewise, DATA past the
flow-control window ends the session; the session's streams fail with a clear error, the
peer gets GOAWAY and `on_dead` has the connection closed. Memory is measured with
tracemalloc while the attacker streams its 16 MiB."""

from __future__ import annotations

import asyncio
import tracemalloc

import h2.config
import h2.connection
import h2.events
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame

from llmfabric.net.errors import RequestFailed
from llmfabric.net.h2endpoint import H2Endpoint
from llmfabric.net.h2limits import MAX_FRAME, MAX_HEADER_BLOCK, STREAM_WINDOW, FrameGate
from llmfabric.net.h2limits import H2LimitError as LimitError
from llmfabric.net.messages import BodyStream, Headers

pytestmark = pytest.mark.hostile
HEADERS, CONTINUATION, DATA = 0x1, 0x9, 0x0


def frame_head(length: int, kind: int, flags: int = 0, sid: int = 1) -> bytes:
    return length.to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big")


class Target:
    """Our server endpoint, and an attacker speaking raw HTTP/2 to it (h2 for the valid
    part: preface, settings, one request's headers)."""

    def __init__(self) -> None:
        self.sent = bytearray()  # what our endpoint emitted
        self.dead = 0
        self.requests: list[tuple[int, Headers, BodyStream]] = []
        self.ep = H2Endpoint(
            client_side=False,
            emit=self.sent.extend,
            drain=_nothing,
            on_request=lambda s, h, b: self.requests.append((s, h, b)),
            on_dead=self._dead,
            name="attacker",
        )
        self.ep.start()
        self.peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.peer.initiate_connection()
        self.peer.receive_data(bytes(self.sent))  # our SETTINGS (acked in its next bytes)
        self.peer.send_headers(
            1,
            [(":method", "POST"), (":scheme", "https"), (":authority", "x"), (":path", "/upload")],
        )
        self.ep.feed(self.peer.data_to_send())
        assert len(self.requests) == 1 and not self.dead
        self.sent.clear()

    def _dead(self) -> None:
        self.dead += 1

    def goaway(self) -> GoAwayFrame:
        events = self.peer.receive_data(bytes(self.sent))
        [ended] = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        frame = GoAwayFrame(0)
        frame.error_code, frame.additional_data = ended.error_code, ended.additional_data or b""
        return frame


async def _nothing() -> None:
    return None


async def test_a_frame_announcing_16_mib_is_refused_at_its_header_with_bounded_memory() -> None:
    t = Target()
    body = t.requests[0][2]
    tracemalloc.start()
    try:
        t.ep.feed(frame_head((1 << 24) - 1, DATA))  # the largest length a header can state
        piece = b"\0" * 65536
        for _ in range(256):  # then 16 MiB, in the pieces a connection reads
            t.ep.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 512 * 1024, f"buffered {peak} bytes"  # (h2 alone: 16 MiB)
    assert t.dead == 1
    goaway = t.goaway()
    assert goaway.error_code == 6  # FRAME_SIZE_ERROR
    assert b"SETTINGS_MAX_FRAME_SIZE" in goaway.additional_data
    with pytest.raises(RequestFailed, match=r"16777215 bytes .* over our SETTINGS_MAX_FRAME"):
        await asyncio.wait_for(body.read(), 5)


async def test_a_header_block_past_the_limit_is_refused() -> None:
    t = Target()
    t.ep.feed(frame_head(MAX_FRAME, HEADERS, sid=3) + b"\0" * MAX_FRAME)  # no END_HEADERS
    for _ in range(MAX_HEADER_BLOCK // MAX_FRAME - 1):
        t.ep.feed(frame_head(MAX_FRAME, CONTINUATION, sid=3) + b"\0" * MAX_FRAME)
    assert t.dead == 0  # (exactly at the limit so far)
    t.ep.feed(frame_head(1, CONTINUATION, sid=3))
    assert t.dead == 1
    assert t.goaway().error_code == 6


async def test_data_past_the_stream_window_ends_the_session() -> None:
    t = Target()
    sid, _, body = t.requests[0]
    chunk = b"x" * MAX_FRAME
    sent = 0
    while sent <= STREAM_WINDOW and not t.dead:  # never reads WINDOW_UPDATEs: overruns
        t.ep.feed(DataFrame(sid, chunk).serialize())
        sent += len(chunk)
    assert t.dead == 1
    assert sent == STREAM_WINDOW + MAX_FRAME  # refused at the first byte past the window
    assert t.goaway().error_code == 3  # FLOW_CONTROL_ERROR
    with pytest.raises(RequestFailed, match="protocol error"):
        await asyncio.wait_for(body.read(), 5)


def test_the_gate_reads_frame_headers_split_anywhere() -> None:
    ok = (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + frame_head(MAX_FRAME, DATA)
        + b"\0" * MAX_FRAME
        + frame_head(4, HEADERS, flags=0x4)
        + b"abcd"
        + frame_head(MAX_FRAME + 1, DATA)
    )
    for cut in range(1, 60):
        gate = FrameGate(preface=True)
        pieces = [ok[i : i + cut] for i in range(0, len(ok), cut)]
        with pytest.raises(LimitError, match=f"{MAX_FRAME + 1} bytes"):
            for p in pieces:
                gate.check(p)
        # everything before the oversized header passed
        gate = FrameGate(preface=True)
        for p in [ok[:-9][i : i + cut] for i in range(0, len(ok) - 9, cut)]:
            gate.check(p)
