"""Forwarding: the ingress's upstream clients (direct, through peers, sealed) and the node
side that takes a forwarded request to its local engine.

Files:
- raw.py: `RawHttpForwarder` = `HttpForwarder`, the default direct forwarder (lean HTTP/1.1
  client: asyncio.Protocol + httptools per pooled keep-alive connection, TCP_NODELAY, every
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
"""
