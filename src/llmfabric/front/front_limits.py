"""Limits of the lean HTTP/1.1 front against abusive clients (nginx-like defaults), the
connection slots they are counted in, and the header-value and content-type checks for
everything the ingress emits.

Each limit answers like nginx does: URL too long -> 414, head too large or too many headers
-> 431, a head or body that trickles in too slowly -> 408 and close, too many connections
(per process or per client address) -> 503 and close. The defaults fit OpenAI clients with
room to spare; `docs/ingress.md` ("Front limits") lists them.

`KeyMemo` holds the API keys seen valid lately, for the pre-body key check.
`ClientSlots` counts open connections per process and per client address. Over HTTPS on
asyncio's own event loop a connection takes its slot when TCP accepts it (`CountedTlsAccept`,
chosen by `listen_args`), not when its handshake is done: a flood of connections that never
finish a handshake is refused at the caps like any other, instead of holding sockets and
256 KiB TLS buffers uncounted until `handshake_timeout_s`. On uvloop (which the CLI uses when
installed) the loop's own TLS layer is kept, for its lower cost per connection (~40 KiB
with no resident buffer, and less CPU per request): there a connection counts once its
handshake is done, and the handshake limit bounds the ones that never finish.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import dataclasses
import ssl
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from llmfabric.net.source_slots import SourceSlots, peer_ip
from llmfabric.net.tlsstream import ServerTlsLayer


@dataclass(frozen=True, slots=True)
class FrontLimits:
    max_url_bytes: int = 8 * 1024  # request target; longer -> 414
    max_head_bytes: int = 32 * 1024  # request line + headers; larger -> 431
    max_headers: int = 100  # header fields; more -> 431
    # HTTPS: accepted -> TLS handshake done (asyncio's default is 60 s): how long a client
    # that connected and then said nothing holds a slot, a socket and TLS buffers.
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

    def overdue(self, now: float, head_done: bool, started: float, last_active: float
                ) -> str | None:
        """Why a request being read is cut with 408 (its head or its body trickles in too
        slowly), or None."""
        if not head_done and now - started >= self.header_timeout_s:
            return f"the request head did not arrive within {self.header_timeout_s} s"
        if head_done and now - last_active >= self.body_timeout_s:
            return f"no request body bytes for {self.body_timeout_s} s"
        return None


class KeyMemo:
    """API keys seen valid in the last `auth_memo_s` (the pre-body check passes them without
    asking the store again), at most MAX_KEYS (forgotten all at once past it)."""

    MAX_KEYS = 10_000

    def __init__(self, limits: FrontLimits) -> None:
        self._for_s = limits.auth_memo_s
        self._until: dict[str, float] = {}

    def fresh(self, token: str, now: float) -> bool:
        until = self._until.get(token)
        return until is not None and until > now

    def remember(self, token: str, now: float) -> None:
        if len(self._until) > self.MAX_KEYS:
            self._until.clear()
        self._until[token] = now + self._for_s


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


# Media types an answer of the API may carry. The dashboard is served on the ingress's origin:
# any other type a node names (text/html, image/svg+xml, none at all, which browsers sniff)
# would let a hostile member's answer run script there when a cross-site form POSTs to an
# ingress without auth, so it goes out as application/octet-stream (downloaded, never run).
_API_TYPES = frozenset({"application/json", "text/event-stream", "text/plain",
                        "application/x-ndjson"})
_SEEN_TYPES: dict[str, str] = {}


def safe_content_type(value: str) -> str:
    """`value` (header-safe) if its media type is one of the API's, else
    application/octet-stream."""
    got = _SEEN_TYPES.get(value)
    if got is None:
        clean = safe_header_value(value)
        essence = clean.partition(";")[0].strip().lower()
        got = clean if essence in _API_TYPES else "application/octet-stream"
        if len(_SEEN_TYPES) > 256:  # (values come from nodes: keep the memo small)
            _SEEN_TYPES.clear()
        _SEEN_TYPES[value] = got
    return got


class ClientSlots(SourceSlots):
    """Open connections, per process and per client address, under `FrontLimits`' caps."""

    def __init__(self, limits: FrontLimits) -> None:
        super().__init__(limits.max_connections, limits.max_connections_per_client)
        self.handshakes_failed = 0  # HTTPS connections that ended mid-handshake
        # HTTPS connections holding a slot before their handshake is done (CountedTlsAccept)
        self.handshaking: set[CountedTlsAccept] = set()

    def counts(self) -> tuple[int, int, int]:
        """(open, refused, handshakes_failed): what the metrics export."""
        return self.total, self.refused, self.handshakes_failed


class SlotHolder(typing.Protocol):
    """What `CountedTlsAccept` hands its slot to: the HTTP protocol of the connection (an
    asyncio.Protocol)."""

    client: str
    counted: bool  # holds a slot (it gives it back when its connection ends)
    transport: asyncio.Transport | None  # set once its connection_made ran


class CountedTlsAccept(ServerTlsLayer):
    """The TLS layer of one accepted HTTPS connection, which takes the connection's slot in
    `slots` at TCP accept: over a cap it aborts at once (no TLS yet, so no 503 can be sent);
    otherwise the slot passes to `app` when the handshake is done (`app.counted`), or is given
    back here if the connection ends before that. Its receive buffer is the peer transport's
    64 KiB, not asyncio's 256 KiB (zero-filled, so resident, per connection; request heads
    and bodies gain nothing from more: net/tlsstream.py)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, app: SlotHolder, ctx: ssl.SSLContext,
                 slots: ClientSlots, handshake_timeout_s: float) -> None:
        super().__init__(loop, cast(asyncio.BaseProtocol, app), ctx, handshake_timeout_s)
        self._app = app
        self._slots = slots
        self._raw: asyncio.Transport | None = None  # while it holds a slot mid-handshake

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ip = peer_ip(transport)
        if not self._slots.take(ip):
            cast(asyncio.Transport, transport).abort()
            return
        self._raw = cast(asyncio.Transport, transport)
        self._slots.handshaking.add(self)
        self._app.client, self._app.counted = ip, True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._slots.handshaking.discard(self)
        if self._raw is not None and self._app.transport is None:  # handshake never done
            self._app.counted = False
            self._slots.give_back(self._app.client)
            self._slots.handshakes_failed += 1
        self._raw = None
        super().connection_lost(exc)

    def abort_handshake(self) -> None:
        """Close the connection if its handshake is not done yet (a front shutting down)."""
        if self._raw is not None and self._app.transport is None:
            self._raw.abort()


def native_tls(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` is asyncio's own (whose TLS layer `CountedTlsAccept` extends), not
    uvloop's or another with a TLS layer of its own."""
    return isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop)


def listen_args(
    loop: asyncio.AbstractEventLoop, make_app: Callable[[], SlotHolder],
    ctx: ssl.SSLContext | None, slots: ClientSlots, handshake_timeout_s: float,
) -> tuple[Callable[[], asyncio.BaseProtocol], dict[str, Any]]:
    """`create_server`'s protocol factory and TLS arguments for a front: plain HTTP, `make_app`
    (the app takes its slot when it is made); HTTPS on asyncio's loop, `CountedTlsAccept`
    layers (slot at accept); HTTPS on another loop, its own TLS layer with the handshake
    limit (slot once the handshake is done)."""
    app_factory = cast(Callable[[], asyncio.BaseProtocol], make_app)
    if ctx is None:
        return app_factory, {}
    if native_tls(loop):
        return lambda: CountedTlsAccept(loop, make_app(), ctx, slots, handshake_timeout_s), {}
    return app_factory, {"ssl": ctx, "ssl_handshake_timeout": handshake_timeout_s}
