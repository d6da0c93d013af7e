"""The node process: the composition root that wires identity, transport, registry, gossip,
membership, the engine agent and (optionally) the ingress into one running node.

  config    NodeConfig: defaults < config file < env vars < flags, validated
  views     JSON views of the replica for the read-only API (docs/http-api.md)
  http_api  /healthz, /metrics, /v1/fabric/* routes (read-only)
  dataplane_server  the provider side of the data plane: session exchange, pinned HTTPS
            listener, sealed peer requests (docs/network.md "Data plane")
  engine_bind  engines on loopback unless --allow-engine-public-bind
  admission  the admission credential from the config; `read_secret_file` (rotation)
"""
