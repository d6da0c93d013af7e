"""What the ingress tells about itself: request traces (spans, the node's hop) and
Prometheus counters. What the node shares (W3C context, OTLP export, the node's hop, the
demand meter) is llmfabric.telemetry.

Files:
- tracing.py: `Tracer` (ring of the last N traces), `RequestTrace` (spans: auth, queue,
  route, attempt -> forward (-> node) / stream; `via=relay`; model_fallback),
  `traced(...)` (run by the fronts), `current_trace()`, `downstream_header()` /
  `downstream_pairs()` (what forwarders send on as `traceparent`).
- metrics.py: `IngressMetrics` (plain counters, collected into its own CollectorRegistry)
  and `metrics_handler`.
"""
