"""What the ingress tells about itself: traces (W3C context, spans, OTLP export, the node's
hop), Prometheus counters and the demand it observes.

Files:
- tracing.py: `Tracer` (ring of the last N traces), `RequestTrace` (spans: auth, queue,
  route, attempt -> forward (-> node) / stream; `via=relay`; model_fallback),
  `traced(...)` (run by the fronts), `current_trace()`, `downstream_header()` /
  `downstream_pairs()` (what forwarders send on as `traceparent`).
- tracecontext.py: W3C `traceparent` parsing/formatting (`parse_traceparent`, hostile input
  -> None: a new trace starts).
- otlp.py: `OtlpExporter` (OTLP/HTTP JSON, batched, bounded, off by default),
  `exporter_from_env` (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).
- node_hop.py: `NodeHop` (`Upstream.hop`: the node's reported time, the relay passed),
  `X-Fabric-Node-Time` (`parse_node_time`, validated; `node_time_value`, the node side).
- node_spans.py: `TracedUpstream`, the provider node's `node.engine` span of a traced
  request (exported when the node has an OTLP exporter).
- trace_routes.py: `traces_handler` (GET /v1/fabric/traces, admin keys).
- metrics.py: `IngressMetrics` (plain counters, collected into its own CollectorRegistry)
  and `metrics_handler`.
- demand.py: `DemandMeter`, the per-model request rate and mean token lengths this ingress
  observes over a sliding window (published in the node's record for the fleet controller).
"""
