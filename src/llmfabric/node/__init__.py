"""The node process: the composition root that wires identity, transport, registry, gossip,
membership, the engine agent and (optionally) the ingress into one running node.

Lifecycle (who owns what)
  daemon          Node: builds the parts, start/stop, when sessions change (eviction ->
                  rejoin), what the node publishes (demand, key grants), the HTTP servers
  supervisor      NodeSupervisor: the one owner of sessions, the engine and every background
                  loop; session changes as one operation, restart policies, stop()
  peering         joining (bootstrap, re-bootstrap, dial-back, relays) and the address book
  engine_role     the engine over its life: start, load hints, restart, assign, release
  engine_link     one engine: supervision (agent/) + the forwarded-request proxy; engines
                  bind loopback unless --allow-engine-public-bind
  kv_events_link  follows the engine's KV-cache events (ZMQ) into the held-prefix sketch
  stream_usage    counts a stream's tokens when the engine sends no usage (the engine's
                  tokenizer; a usage chunk marked estimated before [DONE])
  walltime        drain `lead_s` before the allocation ends; keep the published end current
  pd_roles        keep the record's prefill/decode roles current after a role flip
  pd_flip         the PD controller's signed role flip (/_fabric/v1/role): flip the engine
                  through its adapter, republish the roles at once

Configuration and credentials
  config          NodeConfig: defaults < config file < env vars < flags, validated
  admission       the admission credential from the config; `read_secret_file` (rotation),
                  the provider verifier and record policy (registry.provider)

What the node serves
  http_api        /healthz, /metrics, /v1/fabric/* routes (read-only)
  views           JSON views of the replica for the read-only API (docs/http-api.md)
  replica_reader  the current session's replica as the views, routing, the API and the
                  controllers read it
  metrics         Prometheus metrics of a node (gossip, transport, requests, task failures)
  peer_api        what the node answers on the peer protocol (session exchange, sealed
                  requests, assign, release); assignment and release bodies (both sides)
  dataplane_server  the provider side of the data plane: session exchange, pinned HTTPS
                  listener, sealed peer requests (docs/network.md "Data plane")
  link_service    link measurements on the peer protocol: probe sink, link tables,
                  /v1/fabric/links (the measured matrix for `plan net --from-fabric`)
  ingress_link    the ingress role: OpenAI routes over the live replica, accounts, dashboard
  trace_link      the ingress's anonymized trace (finished requests -> TraceRecorder rows)

The fleet controller's side
  executor        the fleet controller's executor: decisions -> peer-protocol calls
  pd_executor     lightweight-rescheduling decisions: PeerPDExecutor (role flips over the
                  peer protocol, routing plans into the controller's record) and
                  RoleFlipExecutor (engines' /sim/role, in-process PD routers)

Tools
  ports           a free loopback port (engines the node starts, local fabrics, tests)
  local_fabric    LocalFabric: real node processes on loopback (demo, multi-process tests)
"""
