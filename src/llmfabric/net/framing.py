"""Length-prefixed, versioned frames on a peer connection.

Wire format of a frame: ``version:u8 | type:u8 | length:u32 big-endian | payload``. The version
is 1. Payloads longer than the decoder's limit (1 MiB by default) are rejected before they are
buffered. Frame types are append-only; a decoder yields unknown types (the connection counts
and skips them) so a newer peer can add types without breaking older ones.

`FrameDecoder` is incremental and sans-IO: `feed(bytes)` returns the complete frames. On a
frame error it raises and stays failed until `reset()` (a byte stream cannot be resynchronised,
so the connection is closed).
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from llmfabric.net.errors import FrameError, GarbledFrame, OversizedFrame, WrongVersion

VERSION = 1
HEADER = struct.Struct(">BBI")
MAX_PAYLOAD = 1 << 20


class FrameType(IntEnum):
    HELLO = 1  # server -> client: network, nonce, admission kind
    AUTH = 2  # client -> server: peer id, key, signature, admission proof
    ACCEPT = 3  # server -> client: server admission proof
    REFUSE = 4  # either side: reason, then close
    CONFIRM = 5  # client -> server: client accepted the server's proof
    DGRAM = 6  # a Transport message from the connection's peer
    RELAY_DGRAM = 7  # to a relay: forward payload to `dst`
    RELAYED_DGRAM = 8  # from a relay: payload originally from `src`
    H2_TO_SERVER = 9  # bytes of the sender's h2 client session
    H2_TO_CLIENT = 10  # bytes of the sender's h2 server session
    PING = 11
    PONG = 12
    CLOSE = 13


class Frame(NamedTuple):
    # A tuple, not a dataclass: one is made per received frame on the datagram hot path.
    type: int
    payload: bytes


def encode_frame(ftype: int, payload: bytes = b"", *, version: int = VERSION) -> bytes:
    return HEADER.pack(version, ftype, len(payload)) + payload


def append_frame(out: bytearray, ftype: int, payload: bytes) -> int:
    """Append one frame to `out` without building it separately; returns its size."""
    out += HEADER.pack(VERSION, ftype, len(payload))
    out += payload
    return HEADER.size + len(payload)


class FrameDecoder:
    """Incremental decoder; raises FrameError subclasses on bad input."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()
        self._need = 0  # bytes the carried-over partial frame needs before parsing again
        self._failed: FrameError | None = None

    def reset(self) -> None:
        self._buf.clear()
        self._need = 0
        self._failed = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        if self._failed is not None:
            raise type(self._failed)(f"decoder failed earlier: {self._failed}")
        # Parse straight from `data` when nothing is carried over (the usual case: a read
        # ends on a frame boundary), so each payload is copied once; keep only the tail.
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:  # a large frame still arriving: just collect
                return []
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = data if type(data) is bytes else bytes(data)
        frames: list[Frame] = []
        pos, n, hsize, unpack = 0, len(buf), HEADER.size, HEADER.unpack_from
        while n - pos >= hsize:
            version, ftype, length = unpack(buf, pos)
            if version != VERSION:
                self._fail(WrongVersion(f"frame version {version}, this node speaks {VERSION}"))
            if ftype == 0:
                self._fail(GarbledFrame("frame type 0 is invalid"))
            if length > self.max_payload:
                self._fail(OversizedFrame(f"frame of {length} bytes > limit {self.max_payload}"))
            end = pos + hsize + length
            if end > n:
                break
            frames.append(Frame(ftype, buf[pos + hsize : end]))
            pos = end
        if pos < n:
            self._buf += buf[pos:]
            self._need = end - pos if n - pos >= hsize else hsize
        return frames

    def _fail(self, err: FrameError) -> None:
        self._failed = err
        self._buf.clear()
        raise err


def encode_routed(peer_id: str, payload: bytes) -> bytes:
    """Payload of RELAY_DGRAM / RELAYED_DGRAM: u16 id length | peer id | payload."""
    raw = peer_id.encode()
    return struct.pack(">H", len(raw)) + raw + payload


def decode_routed(data: bytes) -> tuple[str, bytes]:
    if len(data) < 2:
        raise GarbledFrame("routed datagram shorter than its header")
    (n,) = struct.unpack_from(">H", data)
    if len(data) < 2 + n or n == 0:
        raise GarbledFrame("routed datagram peer id is truncated")
    try:
        peer = data[2 : 2 + n].decode()
    except UnicodeDecodeError as exc:
        raise GarbledFrame("routed datagram peer id is not UTF-8") from exc
    return peer, data[2 + n :]


__all__ = [
    "HEADER",
    "MAX_PAYLOAD",
    "VERSION",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameType",
    "append_frame",
    "decode_routed",
    "encode_frame",
    "encode_routed",
]
