"""The ingress's request core, OpenAI-compatible: auth, routing, retries, streaming, usage.
One data plane: one request core (`Ingress.serve`), one HTTP server for the OpenAI routes
(the lean front, llmfabric.front), one upstream client (`RawHttpForwarder`, under the data
plane's `PinnedHttpsForwarder` on a node: llmfabric.forward).

Core (this directory):
- app.py: `Ingress` (the request path; `Ingress.serve` is the transport-agnostic core).
- attempt.py: one attempt on one candidate: `attempt_once` (a whole exchange, its usage
  and time), `attempt_stream` (streamed: open, first chunk, relay into the sink with usage
  scanning; `RecordingScanner` records it when it may be continued), `Committed` /
  `Resumable` (how a cut stream ended), `RETRYABLE_STATUS`; `AbandonIfDown`, which drops an
  attempt still waiting for its first byte when the membership marks its node suspected or
  gone (`NodeDown`, retried like a timeout), never a stream already relaying.
- pd_path.py: `PDPath`, the two-phase request of prefill/decode disaggregation (prefill with
  vLLM's `kv_transfer_params`, then the decode carrying the KV handle; retries per phase).
- continuation.py: mid-stream continuation of chat and completions streams: `RelayRecorder`
  (whole SSE events, recorded), `plan_continuation` (the relayed text as an assistant prefix
  with `continue_final_message`, or appended to a completions prompt), `ContinuationRelay`
  (one id, merged usage), `continue_stream`.
- usage.py: cheap usage capture from bodies and SSE streams (`StreamUsageScanner`);
  `claimed_tokens`, a provider's usage claim clamped; the ingress's own estimate for engines
  that report none (`estimate_prompt_tokens`) and a prompt's reservation (`prompt_bound`:
  `MEDIA_PART_TOKENS` per media part, at most `MAX_PROMPT_VALUES` values read).
- request_body.py: what the ingress reads of a client's body before routing it:
  `load_object` (the JSON body within what the ingress can send on: an object, nested at
  most `MAX_DEPTH` deep; `BadJson` otherwise) and the model fallbacks (the body's `models`):
  `requested_models` (the primary and its fallbacks, validated: `InvalidModels`),
  `falls_back` (which failures move a request on to its next model), `MAX_MODEL_CHARS`,
  `MAX_FALLBACKS`.
- paths.py: the pass-through routes, forwarded paths, `FORWARD_PREFIX` (where a node takes
  forwarded requests) and `FORWARDABLE_PATHS` (node side).
- config.py: `IngressConfig`, `Timeouts` (connect, first byte, idle, total; TCP keepalive on
  direct connections), `TraceEvent`.
- protocols.py: every interface of the request path, capabilities included (no probing),
  and `bearer_of` (the token an `Authenticator` is given):
  `CandidateSource` (`watch_down`: None without membership), `Authenticator`, `Principal`
  (`record_trace`), `UsageSink`, `Gate` (admission: budgets, fair queueing; `Refusal`,
  `PriceHold`, `CompletionHold`: what it held), `Forwarder` (`enforces_timeouts`), `Upstream`
  (`read_capped`, `socket_relay()`: a `SocketRelay` or None), `StreamSink` (where a committed
  stream goes; `direct_writer()`: a `DirectWriter` or None), `BodyReader`,
  `read_chunks_capped(chunks, limit)`.
- sources.py: `StaticCandidateSource`, `RecordsCandidateSource` (live registry replica),
  `merged_catalog` (GET /v1/models); `EngineContexts`, the static backends' contexts as
  their engines report them (asked at start, again on a slow period), or as the operator
  states them (`stated`, which wins).
- errors.py: `IngressError`, `UpstreamError`, `ConfigError`, `Reply` (a complete response),
  OpenAI error bodies, `body_too_large`.
- tracing.py: the ingress's request traces: `Tracer` (ring of the last N traces),
  `RequestTrace` (spans: auth, queue, route, attempt -> forward (-> node) / stream;
  `via=relay`; model_fallback), `traced(...)` (run by the fronts), `current_trace()`,
  `downstream_header()` / `downstream_pairs()` (what forwarders send on as `traceparent`).
  W3C context, OTLP export and the node's hop are llmfabric.telemetry, shared with the node.
- metrics.py: `IngressMetrics` (plain Prometheus counters, collected into its own
  CollectorRegistry) and `metrics_handler` (/metrics).

The core is transport-agnostic, and the layer order enforces it (tests/unit/test_layers.py):
its edges sit above it and the core never imports them. They are the translated APIs and
the OpenAPI document (llmfabric.apis: `ApiRoutes`, over `Ingress.serve`), tenancy
(llmfabric.tenancy: `AccountsAuth`, `StaticKeys`, `TenancyGate`, `attach_tenancy`), the
HTTP servers (llmfabric.front: the lean HTTP/1.1 front `FastFront`, the aiohttp app
`build_ingress_app`) and the upstream clients (llmfabric.forward: `HttpForwarder` =
`RawHttpForwarder`, `PeerForwarder`, `ChoosingForwarder`, the data plane's forwarders, the
node's `EngineProxy`). The core defines what they implement (protocols.py: `Authenticator`,
`UsageSink`, `Gate` for tenancy; `StreamSink`, `DirectWriter`, `BodyReader` for a server;
`Forwarder`, `Upstream`, `SocketRelay` for a client). A key's model allowlist, applied on
every request, is routing's (routing/model_access.py).
"""

from llmfabric.ingress.app import Ingress
from llmfabric.ingress.config import IngressConfig, Timeouts, TraceEvent
from llmfabric.ingress.errors import ConfigError, IngressError, UpstreamError
from llmfabric.ingress.metrics import IngressMetrics, metrics_handler
from llmfabric.ingress.paths import FORWARD_PREFIX
from llmfabric.ingress.sources import RecordsCandidateSource, StaticCandidateSource

__all__ = [
    "FORWARD_PREFIX",
    "ConfigError",
    "Ingress",
    "IngressConfig",
    "IngressError",
    "IngressMetrics",
    "RecordsCandidateSource",
    "StaticCandidateSource",
    "Timeouts",
    "TraceEvent",
    "UpstreamError",
    "metrics_handler",
]
