"""What the node serves: its HTTP API and metrics, the peer protocol, the data plane's
provider side (link measurements are net/link_service.py).

Files:
- http_api.py: /healthz, /metrics, /v1/fabric/* routes (read-only) and the JSON views of the
  replica they answer with (docs/http-api.md).
- replica_reader.py: the current session's replica as the views, routing, the API and the
  controllers read it.
- metrics.py: Prometheus metrics of a node (gossip, transport, requests, task failures).
- peer_api.py: what the node answers on the peer protocol (session exchange, sealed
  requests, assign, release); assignment and release bodies (both sides).
- dataplane_server.py: the provider side of the data plane: session exchange, pinned HTTPS
  listener, sealed peer requests (docs/network.md "Data plane").
"""
