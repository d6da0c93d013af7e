"""The node process: the composition root that wires identity, transport, registry, gossip,
membership, the engine agent and (optionally) the ingress into one running node.

Lifecycle (who owns what)
  daemon          Node: builds the parts, start/stop, when sessions change (eviction ->
                  rejoin), what the node publishes (demand, key grants, spend), the HTTP
                  servers
  supervisor      NodeSupervisor: the one owner of sessions, the engine and every background
                  loop; session changes as one operation, restart policies, stop()
  peering         joining (bootstrap, re-bootstrap, dial-back, relays) and the address book

Configuration and credentials
  config          NodeConfig: defaults < config file < env vars < flags, validated
  admission       the admission credential from the config; `read_secret_file` (rotation),
                  the provider verifier and record policy (registry.provider)
  revocations     the operator's revocation list: its file (read at start, followed while
                  running) and the lists passed between nodes (adverts in the records,
                  fetches from peers: verified, bounded, backed off; the copy in --home);
                  the node following it: loaded at start, its loops, SIGHUP, and a list in
                  force applied (connections closed, registry sessions and data-plane keys
                  dropped; the node's own revocation to the daemon)

The engine
  engine_role     the engine over its life: start, load hints, restart, assign, release, and
                  its prefill/decode roles (the role poll; the PD controller's signed role flip)
  engine_link     one engine: supervision (agent/) + the forwarded-request proxy (engines bind
                  loopback unless --allow-engine-public-bind) + its KV-cache events (ZMQ)
                  followed into the held-prefix sketch; the usage of streams whose engine
                  sends none is counted by forward/stream_usage.py

The ingress role
  ingress_link    the ingress role: OpenAI routes over the live replica, accounts, dashboard,
                  the ingress's anonymized trace (finished requests -> TraceRecorder rows)

Subpackage (its docstring maps its files)
  serve           what the node serves: /healthz, /metrics, /v1/fabric/* (http_api,
                  replica_reader, metrics), the peer protocol (peer_api), the data plane's
                  provider side (dataplane_server); the link measurements it answers are
                  net/link_service.py
"""
