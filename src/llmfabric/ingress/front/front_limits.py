"""Limits of the lean HTTP/1.1 front against abusive clients (nginx-like defaults), and the
header-value check for everything the ingress emits.

Each limit answers like nginx does: URL too long -> 414, head too large or too many headers
-> 431, a head or body that trickles in too slowly -> 408 and close, too many connections
(per process or per client address) -> 503 and close. The defaults fit OpenAI clients with
room to spare; `docs/ingress.md` ("Front limits") lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FrontLimits:
    max_url_bytes: int = 8 * 1024  # request target; longer -> 414
    max_head_bytes: int = 32 * 1024  # request line + headers; larger -> 431
    max_headers: int = 100  # header fields; more -> 431
    # HTTPS: accepted -> TLS handshake done (asyncio's default is 60 s). The front counts a
    # connection only once its handshake is done, so this bounds how long a client can hold
    # uncounted sockets and TLS buffers for the price of a TCP connect.
    handshake_timeout_s: float = 10.0
    header_timeout_s: float = 20.0  # from a request's first byte to the end of its head
    body_timeout_s: float = 30.0  # between two reads of a request body
    idle_timeout_s: float = 75.0  # keep-alive: no request for this long -> close
    max_connections: int = 10_000  # per process; above -> 503 + close
    max_connections_per_client: int = 256  # per client IP address; above -> 503 + close
    # A key seen valid is trusted for the pre-body check this long (the request core still
    # authenticates every request, revocations included): keyless or unknown-key clients
    # never get their body buffered.
    auth_memo_s: float = 5.0

    def __post_init__(self) -> None:
        counts = {"max_url_bytes": self.max_url_bytes, "max_head_bytes": self.max_head_bytes,
                  "max_headers": self.max_headers, "max_connections": self.max_connections,
                  "max_connections_per_client": self.max_connections_per_client}
        for name, count in counts.items():
            if count < 1:
                raise ValueError(f"{name} must be >= 1")
        spans = {"handshake_timeout_s": self.handshake_timeout_s,
                 "header_timeout_s": self.header_timeout_s,
                 "body_timeout_s": self.body_timeout_s, "idle_timeout_s": self.idle_timeout_s}
        for name, span in spans.items():
            if span <= 0:
                raise ValueError(f"{name} must be > 0")


def front_limits(values: Mapping[str, object]) -> FrontLimits:
    """FrontLimits with `values` (field name -> number or numeric string) over the defaults;
    ValueError names an unknown field or a bad value (`--front-limit KEY=VALUE`)."""
    fields = {f.name: f.type for f in dataclasses.fields(FrontLimits)}
    changes: dict[str, Any] = {}  # (each value converted to its field's type)
    for key, raw in values.items():
        if key not in fields:
            raise ValueError(f"unknown front limit {key!r} (known: {', '.join(fields)})")
        try:
            number = float(str(raw))
            changes[key] = int(number) if fields[key] in (int, "int") else number
        except ValueError:
            raise ValueError(f"front limit {key}={raw!r} is not a number") from None
    return dataclasses.replace(FrontLimits(), **changes)


def safe_header_value(value: str) -> str:
    """`value` without control characters (CR, LF, NUL, ...) and non-latin-1 characters: a
    value that came from elsewhere (a session id from the registry, an engine's content type)
    can never split or add response headers."""
    if value.isascii() and value.isprintable():
        return value  # the common case: one C-level scan
    return "".join(c for c in value if " " <= c <= "~")
