"""Fabric-wide telemetry, shared by the ingress and the provider node: trace context and
export, the node's reported hop time, and the per-model demand an ingress observes. Nothing
here depends on the ingress (the ingress's own tracer and counters stay in it: ingress/tracing.py,
ingress/metrics.py).

Files:
- tracecontext.py: W3C `traceparent` parsing/formatting (`parse_traceparent`, hostile input
  -> None: a new trace starts; `TraceParent`, `new_span_id`).
- otlp.py: `OtlpExporter` (OTLP/HTTP JSON, batched, bounded, off by default),
  `exporter_from_env` (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT); the ingress's tracer and the
  node's `node.engine` spans both export through it.
- node_hop.py: `NodeHop` (`Upstream.hop`: the node's reported time, the relay passed),
  `X-Fabric-Node-Time` (`parse_node_time`, validated, the ingress side; `node_time_value`,
  the node side).
- demand.py: `DemandMeter`, the per-model request rate and mean token lengths an ingress
  observes over a sliding window (published as `ModelDemand` in the node's registry record
  for the fleet controller), and `moved` (whether a snapshot changed enough to republish).
"""
