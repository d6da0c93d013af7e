"""OpenAI-compatible HTTP front (plus the Responses and Anthropic Messages APIs): auth,
routing, streaming proxy, forwarding. One data plane: one request core (`Ingress.serve`),
one HTTP server for the OpenAI routes (the lean front), one upstream client
(`RawHttpForwarder`, under the data plane's `PinnedHttpsForwarder` on a node).

Files:
- app.py: `Ingress` (the request path; `Ingress.serve` is the transport-agnostic core).
- stream_attempt.py: `attempt_stream` (one streamed attempt: open, first chunk, relay into
  the sink with usage scanning), `Committed` / `Resumable` (how a cut stream ended),
  `RETRYABLE_STATUS`.
- pd_path.py: `PDPath`, the two-phase request of prefill/decode disaggregation (prefill with
  vLLM's `kv_transfer_params`, then the decode carrying the KV handle; retries per phase).
- web_app.py: `build_ingress_app(config, candidate_source, forwarder, auth, usage_sink,
  metrics)` for an aiohttp app over the same core (tests, embedding),
  `add_ingress_routes(app, ingress)` to mount the routes in a node's app (for requests on a
  connection the front handed over).
- web_sink.py: `WebSink` (a StreamSink over an aiohttp request) and `web_response(reply)`.
- fast_front.py: `FastFront(ingress, fallback=...)`, the lean HTTP/1.1 server (asyncio.Protocol
  + httptools) every ingress answers the OpenAI routes with: `llmfabric ingress` (and
  /metrics), and a fabric node's HTTP port, where `fallback` (the node app's
  `AppRunner.server`) takes over each connection whose request is another path (dashboard,
  fleet API, accounts); `await front.start(host, port, ...)`, `await front.aclose()`.
- fast_routes.py: which paths the front answers itself (`owned`, `route`).
- fast_wire.py: the lean front's wire pieces: `FrontRequest` (what it keeps of a request while
  reading it), `response_head`, `reply_bytes` (a complete response, heads cached),
  `ResponseSink` (chunked or close-delimited streams; its own `DirectWriter`), `not_allowed`.
- api_routes.py: `ApiRoutes` (`Ingress.api`): POST /v1/responses, /v1/messages and the
  pass-through paths over `Ingress.serve`; errors reshaped per API.
- responses_api.py: the Responses API <-> chat completions (stateless, `store=false`),
  `ResponsesStream` (its event stream); `TranslationError` (-> 400).
- anthropic_api.py: Anthropic Messages <-> chat completions, `MessagesStream`,
  `anthropic_error`.
- chat_stream.py: `ChatStreamTranslator`, a StreamSink that parses chat SSE chunks for the
  translated APIs' streams.
- continuation.py: mid-stream continuation of chat and completions streams: `RelayRecorder`
  (whole SSE events, recorded), `plan_continuation` (the relayed text as an assistant prefix
  with `continue_final_message`, or appended to a completions prompt), `ContinuationRelay`
  (one id, merged usage), `continue_stream`.
- paths.py: the pass-through routes, forwarded paths, `FORWARD_PREFIX` (where a node takes
  forwarded requests) and `FORWARDABLE_PATHS` (node side).
- config.py: `IngressConfig`, `Timeouts` (connect, first byte, idle, total), `TraceEvent`.
- protocols.py: every interface of the request path, capabilities included (no probing):
  `CandidateSource`, `Authenticator`, `Principal` (`record_trace`), `UsageSink`, `Forwarder`
  (`enforces_timeouts`), `Upstream` (`read_capped`, `socket_relay()`: a `SocketRelay` or
  None), `StreamSink` (where a committed stream goes; `direct_writer()`: a `DirectWriter` or
  None), `BodyReader`, `read_chunks_capped(chunks, limit)`.
- sources.py: `StaticCandidateSource`, `RecordsCandidateSource` (live registry replica).
- forward_raw.py: `RawHttpForwarder` = `HttpForwarder`, the default direct forwarder (lean
  HTTP/1.1 client: asyncio.Protocol + httptools per pooled keep-alive connection,
  TCP_NODELAY, every `Timeouts` phase enforced with one timer per connection,
  `RawUpstream.relay(push, writable)` for streams relayed from the socket callback).
- forward_peer.py: `PeerForwarder` (peer request API, relays) and `ChoosingForwarder`.
- forward_secure.py: the data plane's ingress side (llmfabric.dataplane): `DataPlaneSessions`
  (a session key per provider), `PinnedHttpsForwarder` (direct: HTTPS pinned to the node key,
  per-request `X-Fabric-Auth`), `SealedPeerForwarder` (sealed end to end through relays).
- front_limits.py: `FrontLimits` (URL/head sizes, read timeouts, connection caps of the lean
  front) and `safe_header_value` (no control characters in emitted headers).
- engine_proxy.py: node side, `EngineProxy` + `add_engine_proxy_routes` (forwarded request ->
  local engine, streamed; `around` lets the node wrap each engine call).
- engine_upstream.py: `HttpUpstream`, the engine's response over aiohttp's client (the node's
  one client to its own engine).
- usage.py: cheap usage capture from bodies and SSE streams (`StreamUsageScanner`).
- accounts_auth.py: adapters from llmfabric.accounts (AccountStore, RateLimiter) and
  `StaticKeys` for tests/benchmarks.
- demand.py: `DemandMeter`, the per-model request rate and mean token lengths this ingress
  observes over a sliding window (published in the node's record for the fleet controller).
- tracecontext.py: W3C `traceparent` parsing/formatting (`parse_traceparent`, hostile input
  -> None: a new trace starts).
- tracing.py: `Tracer` (ring of the last N traces), `RequestTrace` (spans: auth, queue,
  route, attempt -> forward (-> node) / stream; `via=relay`), `traced(...)` (run by the
  fronts), `current_trace()`, `downstream_header()` / `downstream_pairs()` (what forwarders
  send on as `traceparent`).
- otlp.py: `OtlpExporter` (OTLP/HTTP JSON, batched, bounded, off by default),
  `exporter_from_env` (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).
- node_hop.py: `NodeHop` (`Upstream.hop`: the node's reported time, the relay passed),
  `X-Fabric-Node-Time` (`parse_node_time`, validated; `node_time_value`, the node side).
- node_spans.py: `TracedUpstream`, the provider node's `node.engine` span of a traced
  request (exported when the node has an OTLP exporter).
- trace_routes.py: `traces_handler` (GET /v1/fabric/traces, admin keys).
- tenancy.py: `TenancyGate` (budget reservation + fair-queue slot per request; 429 with the
  real wait), `reservation(doc)`.
- tenancy_setup.py: `attach_tenancy(ingress, store, max_inflight=, env=)` (budgets, fair
  queue, OTLP exporter from settings) -> `TenancyParts`.
- metrics.py: `IngressMetrics` (plain counters, collected into its own CollectorRegistry)
  and `metrics_handler`.
- openapi.py: `openapi_document()`, the OpenAPI 3.1 description of every route an ingress
  node serves, and `add_openapi_route(app)` (GET /openapi.json).
- errors.py: `IngressError`, `UpstreamError`, `ConfigError`, `Reply` (a complete response),
  OpenAI error bodies.
"""

from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import IngressConfig, Timeouts, TraceEvent
from llmfabric.ingress.engine_proxy import EngineProxy, add_engine_proxy_routes
from llmfabric.ingress.errors import ConfigError, IngressError, UpstreamError
from llmfabric.ingress.forward_peer import ChoosingForwarder, PeerForwarder
from llmfabric.ingress.forward_raw import RawHttpForwarder
from llmfabric.ingress.metrics import IngressMetrics, metrics_handler
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.sources import RecordsCandidateSource, StaticCandidateSource
from llmfabric.ingress.web_app import add_ingress_routes, build_ingress_app

HttpForwarder = RawHttpForwarder  # the default direct forwarder

__all__ = [
    "FORWARD_PREFIX",
    "ChoosingForwarder",
    "ConfigError",
    "EngineProxy",
    "HttpForwarder",
    "Ingress",
    "IngressConfig",
    "IngressError",
    "IngressMetrics",
    "PeerForwarder",
    "RawHttpForwarder",
    "RecordsCandidateSource",
    "StaticCandidateSource",
    "Timeouts",
    "TraceEvent",
    "UpstreamError",
    "add_engine_proxy_routes",
    "add_ingress_routes",
    "build_ingress_app",
    "metrics_handler",
]
