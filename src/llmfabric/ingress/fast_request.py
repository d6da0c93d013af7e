"""The lean front's parse state of one request (`FrontRequest`) and `Stop`, raised inside a
parser callback once a limit was hit or the connection is handed over (the answer is queued)."""

from __future__ import annotations

from llmfabric.ingress.errors import Reply


class Stop(Exception):
    """Internal: a limit was hit inside a parser callback; the error is already queued."""


class FrontRequest:
    """What the front keeps of a request while it is read (only what the core needs)."""

    __slots__ = ("auth", "auth_wait", "body", "close", "error", "expect", "hand_over",
                 "head_done", "headers", "keep_alive", "method", "parts", "providers", "size",
                 "started", "url", "version")

    def __init__(self, started: float = 0.0) -> None:
        self.url = b""
        self.method = b""
        self.auth = ""
        self.providers: str | None = None
        self.parts: list[bytes] = []
        self.body = b""
        self.size = 0
        self.keep_alive = True
        self.version = "1.1"
        self.error: Reply | None = None  # answer this instead, then close
        self.close = False
        self.expect = False  # Expect: 100-continue
        self.started = started  # monotonic time of the first byte (header timeout)
        self.head_done = False
        self.headers = 0  # header fields seen, and their bytes (in `size` until the body)
        self.auth_wait = False  # reading paused until the key is known valid
        self.hand_over = False  # not ours: the connection goes to the fallback server
