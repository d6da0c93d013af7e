"""What one peer can make an HTTP/2 session (h2endpoint.py) hold in memory, and the check that
enforces it on the way in.

`h2`'s frame buffer validates a frame's length only once the whole frame has arrived, so a
frame header announcing 16 MiB made it buffer 16 MiB before refusing. `FrameGate` reads
each frame header as its 9 bytes arrive (walking the byte stream without copying it) and
refuses, before any of the body is buffered: a frame longer than the SETTINGS_MAX_FRAME_SIZE
we advertise, and a header block (HEADERS or PUSH_PROMISE plus CONTINUATIONs) longer than
`MAX_HEADER_BLOCK`. DATA beyond the flow-control windows is refused by `h2` itself
(FLOW_CONTROL_ERROR). Per session a peer can therefore make us hold at most: the
connection window of unread DATA (`CONNECTION_WINDOW` + 64 KiB, at most `STREAM_WINDOW`
per stream), one frame, and one header block; a peer connection carries two sessions.
"""

from __future__ import annotations

MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE we advertise (the protocol's minimum)
MAX_HEADER_LIST = 1 << 16  # SETTINGS_MAX_HEADER_LIST_SIZE we advertise (decoded size)
MAX_HEADER_BLOCK = 1 << 16  # encoded header block bytes (HEADERS + CONTINUATIONs)
STREAM_WINDOW = 1 << 20  # per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE)
CONNECTION_WINDOW = 1 << 22  # added to the connection's 64 KiB default: 4 streams at full window
PREFACE_LEN = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", which h2 itself checks

_HEADERS, _PUSH_PROMISE, _CONTINUATION = 0x1, 0x5, 0x9
_END_HEADERS = 0x4
_HEADER_KINDS = frozenset((_HEADERS, _PUSH_PROMISE, _CONTINUATION))


class H2LimitError(Exception):
    """The peer sent a frame we refuse to buffer; the session must end."""


class FrameGate:
    """Checks the frame headers of one direction of an HTTP/2 session as bytes arrive."""

    __slots__ = ("_block", "_head", "_left", "_skip")

    def __init__(self, *, preface: bool) -> None:
        self._skip = PREFACE_LEN if preface else 0
        self._head = b""  # a frame header split across feeds
        self._left = 0  # body bytes of the current frame still to come
        self._block = 0  # header block bytes so far

    def check(self, data: bytes) -> None:
        """Raise H2LimitError at the first frame header over a limit."""
        i, n = 0, len(data)
        if self._skip:
            i = min(self._skip, n)
            self._skip -= i
        if self._left:  # the rest of a frame begun in an earlier feed
            if self._left >= n - i:
                self._left -= n - i
                return
            i += self._left
            self._left = 0
        if self._head:  # a header split across feeds
            head = self._head + data[i : i + 9 - len(self._head)]
            if len(head) < 9:
                self._head = head
                return
            i += 9 - len(self._head)
            self._head = b""
            i += self._frame(head, 0)
        while i + 9 <= n:  # (the common case: whole headers, indexed in place)
            i += 9 + self._frame(data, i)
        if i > n:
            self._left = i - n
        elif i < n:
            self._head = data[i:]

    def _frame(self, buf: bytes, j: int) -> int:
        """Check the frame header at buf[j : j + 9]; return its body length."""
        length = buf[j] << 16 | buf[j + 1] << 8 | buf[j + 2]
        if length > MAX_FRAME:
            raise H2LimitError(
                f"HTTP/2 frame of {length} bytes from the peer is over our "
                f"SETTINGS_MAX_FRAME_SIZE ({MAX_FRAME})"
            )
        kind = buf[j + 3]
        if kind in _HEADER_KINDS:
            self._block = length if kind != _CONTINUATION else self._block + length
            if self._block > MAX_HEADER_BLOCK:
                raise H2LimitError(
                    f"HTTP/2 header block over {MAX_HEADER_BLOCK} bytes from the peer"
                )
            if buf[j + 4] & _END_HEADERS:
                self._block = 0
        return length
