"""Forwarding: the ingress's upstream clients (direct, through peers, sealed) and the node
side that takes a forwarded request to its local engine.

Why a layer above llmfabric.ingress: the ingress core is transport-agnostic. It sends each
attempt through a `Forwarder` and reads the answer from an `Upstream` (both defined, with
their capabilities, in llmfabric.ingress.protocols: `enforces_timeouts`, `read_capped`,
`socket_relay()`); a client here implements those interfaces and is handed to `Ingress` by
whoever wires it (a node, `llmfabric ingress`). So the clients import the core (its config,
errors, paths, protocols, tracing) and never the other way round, and
tests/unit/test_layers.py enforces it: the core cannot import a client. The HTTP servers
(llmfabric.front) are this package's sibling, of the same rank: a forwarder never imports a
server, nor a server a forwarder.

Files:
- raw.py: `RawHttpForwarder` (= `HttpForwarder`, here), the default direct forwarder (lean
  HTTP/1.1 client: asyncio.Protocol + httptools per pooled keep-alive connection, TCP_NODELAY, every
  `Timeouts` phase enforced with one timer per connection, `RawUpstream.relay(push,
  writable)` for streams relayed from the socket callback).
- dial_gate.py: `DialGate`, at most N connection attempts in flight per node (an honest
  burst stays under a provider's cap on connections mid-handshake).
- peer.py: `PeerForwarder` (peer request API, relays) and `ChoosingForwarder`.
- secure.py: the data plane's ingress side (llmfabric.dataplane): `DataPlaneSessions` (a
  session key per provider), `PinnedHttpsForwarder` (direct: HTTPS pinned to the node key,
  per-request `X-Fabric-Auth`), `SealedPeerForwarder` (sealed end to end through relays).
- engine_proxy.py: node side, `EngineProxy` + `add_engine_proxy_routes` (forwarded request ->
  local engine, streamed; `around` lets the node wrap each engine call), `HttpUpstream` (the
  engine's response over aiohttp's client, the node's one client to its own engine) and
  `TracedUpstream` (the engine's response to a traced request, exporting the node's
  `node.engine` span).
- stream_usage.py: `StreamUsageCounter`, an `around` for the engine proxy: counts a stream's
  tokens when the engine sends no usage (the engine's tokenizer; a usage chunk marked
  estimated before [DONE]).
"""

from llmfabric.forward.engine_proxy import EngineProxy, add_engine_proxy_routes
from llmfabric.forward.peer import ChoosingForwarder, PeerForwarder
from llmfabric.forward.raw import RawHttpForwarder

HttpForwarder = RawHttpForwarder  # the default direct forwarder

__all__ = [
    "ChoosingForwarder",
    "EngineProxy",
    "HttpForwarder",
    "PeerForwarder",
    "RawHttpForwarder",
    "add_engine_proxy_routes",
]
