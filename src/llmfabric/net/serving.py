"""Serving one incoming peer request: origin through a relay, internal paths (dial-back,
relay registration), relay forwarding, the node's handler; errors become 500s and a
caller's reset cancels the handler (the task is cancelled by the transport)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from llmfabric.net.connection import PeerConnection
from llmfabric.net.messages import BodyStream, HandlerResponse, Headers, PeerRequest
from llmfabric.untrusted import get_logger, log_due

if TYPE_CHECKING:
    from llmfabric.net.tls_transport import TlsTransport

log = get_logger(__name__)

INTERNAL_PREFIX = "/_llmfabric/"
RELAY_TO = "x-llmfabric-relay-to"
ORIGIN = "x-llmfabric-origin"
RELAY_ERROR = "x-llmfabric-relay-error"


async def serve_request(
    t: TlsTransport, conn: PeerConnection, sid: int, headers: Headers, body: BodyStream
) -> None:
    """Serve one request that arrived on `conn`'s h2 server session (stream `sid`)."""
    pseudo = {k: v for k, v in headers if k.startswith(":")}
    plain = tuple((k, v) for k, v in headers if not k.startswith(":"))
    method, path = pseudo.get(":method", "GET"), pseudo.get(":path", "/")
    origin, via = conn.peer_id, None
    claimed = dict(plain).get(ORIGIN)
    if claimed is not None and t.relay.is_my_relay(conn.peer_id):
        origin, via = claimed, conn.peer_id
    plain = tuple((k, v) for k, v in plain if k != ORIGIN)
    try:
        if path.startswith(INTERNAL_PREFIX):
            resp = await t.relay.handle_internal(conn, method, path, body)
        elif any(k == RELAY_TO for k, _ in plain):
            resp = await t.relay.forward(conn, method, path, plain, body)
        elif t._request_handler is None:
            resp = HandlerResponse(404, (), b"no request handler on this node")
        elif origin in t.refused:  # (relayed from a revoked member by a relay that lacks
            resp = HandlerResponse(403, (), b"membership revoked")  # the list)
        else:
            t.stats.requests_served += 1
            resp = await t._request_handler(PeerRequest(origin, method, path, plain, body, via))
    except asyncio.CancelledError:
        conn.server.reset_stream(sid)
        raise
    except Exception as exc:
        t.stats.error("request_handler")
        n = t.stats.errors["request_handler"]
        if log_due(n):  # (a peer can repeat a request that fails at will: no log flood)
            log.error("request handler failed for %s %s from %s: %r; %d failure(s) so far "
                      "(llmfabric_net_errors{where=request_handler})", method, path, origin,
                      exc, n, exc_info=n == 1)
        resp = HandlerResponse(500, (), f"handler error: {exc}".encode())
    try:
        await conn.server.respond(sid, resp.status, resp.headers, resp.body)
    except Exception as exc:
        t.stats.error("respond")
        n = t.stats.errors["respond"]
        if log_due(n):  # (a peer that resets its streams makes this fail at will)
            log.error("streaming the response to %s %s to %s failed: %r; %d failure(s) so far "
                      "(llmfabric_net_errors{where=respond})", method, path, conn.peer_id,
                      exc, n, exc_info=n == 1)
        conn.server.reset_stream(sid)
