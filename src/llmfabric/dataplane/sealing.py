"""End-to-end sealing inside the peer stream (relays forward what they cannot read or alter).

Request body: AES-256-GCM under the session key, nonce = the request id (12 random bytes,
never reused: the replay cache refuses a second use), associated data = the authorization
prefix and path. Response: frames `u32 length | AES-GCM(response key, nonce = counter)`,
the response key = HMAC(session key, "resp" || request id); a frame's first byte says what it
is: HEAD (status, content type), DATA, END. A missing END is a truncated response.

Trace context: the request's `traceparent` travels sealed in `x-fabric-sealed-trace`
(AES-GCM under HMAC(session key, "trace" || request id), the same associated data as the
body), padded to TRACE_PAD bytes and sent on every request, traced or not, so a relay learns
neither the trace id (which would link the requests of one trace across relays and hops)
nor from this header whether a request is traced.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from llmfabric.dataplane.authz import AuthzError

HEAD, DATA, END = 0, 1, 2
MAX_FRAME = 2 * 1024 * 1024
SEALED_TYPE = "application/x-llmfabric-sealed"


def seal_body(key: bytes, rid: bytes, aad: bytes, body: bytes) -> bytes:
    return AESGCM(key).encrypt(rid, body, aad)


def open_body(key: bytes, rid: bytes, aad: bytes, sealed: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(rid, sealed, aad)
    except InvalidTag:
        raise AuthzError("bad_seal", "the sealed request body does not authenticate") from None


TRACE_HEADER = "x-fabric-sealed-trace"  # (not X-Fabric-Trace, the id a client gets)
TRACE_PAD = 64  # a W3C traceparent of version 00 has 55 characters
_TRACE_MAX = 512  # characters of the header; longer is refused, not decoded


def _trace_cipher(key: bytes, rid: bytes) -> AESGCM:
    return AESGCM(hmac.new(key, b"trace" + rid, hashlib.sha256).digest())


def seal_trace(key: bytes, rid: bytes, aad: bytes, traceparent: str) -> str:
    """`traceparent` ("" for none) sealed for TRACE_HEADER: one message per derived key, so
    the nonce is fixed; NUL-padded to a multiple of TRACE_PAD."""
    raw = traceparent.encode()
    raw += b"\0" * (-len(raw) % TRACE_PAD or (0 if raw else TRACE_PAD))
    ct = _trace_cipher(key, rid).encrypt(bytes(12), raw, aad)
    return base64.urlsafe_b64encode(ct).decode()


def open_trace(key: bytes, rid: bytes, aad: bytes, value: str) -> str | None:
    """The `traceparent` sealed in TRACE_HEADER (None: the request is not traced); a value
    that does not authenticate (a changed or moved header) is a `bad_seal`."""
    try:
        if len(value) > _TRACE_MAX:
            raise ValueError
        raw = _trace_cipher(key, rid).decrypt(bytes(12), base64.urlsafe_b64decode(value), aad)
        text = raw.rstrip(b"\0").decode()
    except (InvalidTag, ValueError):
        raise AuthzError("bad_seal", "the sealed trace context does not authenticate") from None
    return text or None


def _response_cipher(key: bytes, rid: bytes) -> AESGCM:
    return AESGCM(hmac.new(key, b"resp" + rid, hashlib.sha256).digest())


class Sealer:
    """Provider side: the response as sealed frames."""

    __slots__ = ("_aead", "_n")

    def __init__(self, key: bytes, rid: bytes) -> None:
        self._aead = _response_cipher(key, rid)
        self._n = 0

    def frame(self, kind: int, data: bytes) -> bytes:
        nonce = self._n.to_bytes(12, "big")
        self._n += 1
        ct = self._aead.encrypt(nonce, bytes((kind,)) + data, None)
        return struct.pack(">I", len(ct)) + ct

    def head(self, status: int, content_type: str) -> bytes:
        return self.frame(HEAD, orjson.dumps({"status": status, "content_type": content_type}))


class FrameOpener:
    """Ingress side: feed sealed bytes, get (kind, plaintext) frames in order."""

    __slots__ = ("_aead", "_buf", "_n", "ended")

    def __init__(self, key: bytes, rid: bytes) -> None:
        self._aead = _response_cipher(key, rid)
        self._buf = b""
        self._n = 0
        self.ended = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf + data if self._buf else data
        out: list[tuple[int, bytes]] = []
        # An offset, sliced once at the end: cutting the buffer after each frame copied the
        # rest of the chunk per frame (quadratic in a chunk of many small frames).
        pos, end = 0, len(buf)
        view = memoryview(buf)
        while end - pos >= 4:
            (size,) = struct.unpack_from(">I", buf, pos)
            if size > MAX_FRAME:
                raise AuthzError("bad_seal", "sealed frame too large")
            if end - pos < 4 + size:
                break
            try:
                plain = self._aead.decrypt(self._n.to_bytes(12, "big"),
                                           view[pos + 4 : pos + 4 + size], None)
            except InvalidTag:
                raise AuthzError("bad_seal", "a sealed response frame was altered") from None
            self._n += 1
            pos += 4 + size
            if not plain or self.ended:
                raise AuthzError("bad_seal", "unexpected sealed frame")
            if plain[0] == END:
                self.ended = True
            out.append((plain[0], plain[1:]))
        self._buf = buf[pos:] if pos else buf
        return out
