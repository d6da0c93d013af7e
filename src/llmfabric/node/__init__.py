"""The node process: the composition root that wires identity, transport, registry, gossip,
membership, the engine agent and (optionally) the ingress into one running node.

  daemon          Node: start/stop, sessions (rejoin after eviction), the HTTP servers
  config          NodeConfig: defaults < config file < env vars < flags, validated
  admission       the admission credential from the config; `read_secret_file` (rotation),
                  the provider verifier and record policy (registry.provider)
  engine_link     the node's engine: supervision (agent/) + the forwarded-request proxy
  stream_usage    counts a stream's tokens when the engine sends no usage (the engine's
                  tokenizer; a usage chunk marked estimated before [DONE])
  ingress_link    the ingress role: OpenAI routes over the live replica, accounts, dashboard
  trace_link      the ingress's anonymized trace (finished requests -> TraceRecorder rows)
  replica_reader  the current agent's replica as the views, routing and the API read it
  views           JSON views of the replica for the read-only API (docs/http-api.md)
  http_api        /healthz, /metrics, /v1/fabric/* routes (read-only)
  peer_api        what the node answers on the peer protocol (assign, release, engine)
  assignment      engine assignments from the fleet controller (parse, command line)
  release         releasing an assigned engine on the controller's request
  executor        the fleet controller's executor: decisions -> peer-protocol calls
  metrics         Prometheus metrics of a node (gossip, transport, requests), read on scrape
  ports           a free loopback port (engines the node starts, local fabrics, tests)
  local_fabric    LocalFabric: real node processes on loopback (demo, multi-process tests)
  dataplane_server  the provider side of the data plane: session exchange, pinned HTTPS
                  listener, sealed peer requests (docs/network.md "Data plane")
  engine_bind     engines on loopback unless --allow-engine-public-bind
  walltime        drain `lead_s` before the allocation ends; keep the published end current
  link_service    link measurements on the peer protocol: probe sink, link tables,
                  /v1/fabric/links (the measured matrix for `plan net --from-fabric`)
"""
