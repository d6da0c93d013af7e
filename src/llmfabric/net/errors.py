"""Errors of the net package. Messages say what to do."""

from __future__ import annotations


class NetError(Exception):
    """Base class for transport failures."""


class PeerUnreachable(NetError):
    """No direct address or relay reached the peer (check its record's addresses/relays)."""


class HandshakeRefused(NetError):
    """The TLS/application handshake failed: wrong peer id, bad signature or admission."""

    def __init__(self, reason: str, *, code: str = "refused") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class RequestFailed(NetError):
    """A peer request failed after the connection was set up (reset, timeout, closed)."""


class BodyTooLarge(RequestFailed):
    """A peer's request or response body passed the reader's limit; the stream was reset."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")
        self.limit = limit


class PeerClosed(RequestFailed):
    """The peer closed an idle connection (idle timeout or its connection cap) before it saw
    this request, so the request was not processed and is safe to send again."""


class FrameError(NetError):
    """Invalid bytes on a peer connection; the connection is closed."""

    code = "garbled"


class GarbledFrame(FrameError):
    code = "garbled"


class OversizedFrame(FrameError):
    code = "oversized"


class WrongVersion(FrameError):
    code = "wrong_version"
