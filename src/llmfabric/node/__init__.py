"""The node process: the composition root that wires identity, transport, registry, gossip,
membership, the engine agent and (optionally) the ingress into one running node.

  config    NodeConfig: defaults < config file < env vars < flags, validated
  views     JSON views of the replica for the read-only API (docs/http-api.md)
  http_api  /healthz, /metrics, /v1/fabric/* routes (read-only)
"""
