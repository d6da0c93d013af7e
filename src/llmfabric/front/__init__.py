"""The ingress's HTTP servers: the lean front every ingress answers the OpenAI routes with,
and the aiohttp app over the same core (tests, embedding, a node's handed-over connections).

Why a layer above llmfabric.ingress: the ingress core is transport-agnostic. It takes a
request as `Ingress.serve(path, streamable, authorization, providers, body, sink)` and
writes a committed stream into a `StreamSink` (llmfabric.ingress.protocols defines it, with
`DirectWriter` and `BodyReader`); a server only parses HTTP, calls the core and implements
those interfaces (`ResponseSink`, `WebSink`). So the servers import the core and never the
other way round, and tests/unit/test_layers.py enforces it: the core cannot import a server.
The upstream clients (llmfabric.forward) are this package's sibling, of the same rank: a
server never imports a forwarder, nor a forwarder a server; the node and `llmfabric ingress`
wire the two to an `Ingress`. The API dialects (llmfabric.apis: `ApiRoutes`, the OpenAPI
document) rank between the core and the servers: each front builds its `ApiRoutes` over the
ingress and serves the /openapi.json it is given (with the Batch API's routes where those are
mounted beside).

Files:
- fast_front.py: `FastFront(ingress, fallback=...)`, the lean HTTP/1.1 server (asyncio.Protocol
  + httptools) every ingress answers the OpenAI routes with: `llmfabric ingress` (and
  /metrics), and a fabric node's HTTP port, where `fallback` (the node app's
  `AppRunner.server`) takes over each connection whose request is another path (dashboard,
  fleet API, accounts); `await front.start(host, port, ...)`, `await front.aclose()`.
- fast_routes.py: which paths the front answers itself (`owned`, `route`).
- fast_wire.py: the lean front's wire pieces: `FrontRequest` (what it keeps of a request while
  reading it, `keep_header`), `response_head`, `reply_bytes` (a complete response, heads
  cached), `ResponseSink` (chunked or close-delimited streams; its own `DirectWriter`),
  `not_allowed`, `switch_protocol` (a connection handed to the fallback server).
- front_limits.py: `FrontLimits` (URL/head sizes, TLS handshake and read timeouts with
  `overdue`, connection caps of the lean front), `KeyMemo` (keys that pass the pre-body key
  check at once), `ClientSlots` (the caps' counts; over HTTPS on asyncio's loop
  taken at TCP accept by `CountedTlsAccept`), `listen_args` (plain, counted TLS, or the
  loop's own TLS on uvloop) and `safe_header_value` (no control characters in emitted
  headers).
- key_precheck.py: `KeyPrecheck`, the lean front's API key check before any body is
  buffered (no key -> 401 at once, keys seen valid lately pass, others pause reading until
  the key store answered).
- host_check.py: `HostGuard` (the Host names a node answers, against DNS rebinding, and the
  refusal of state-changing requests a browser sent from another site: `refusal`, used by
  both fronts), `allowed_names` (--allowed-host values), `names_of` (the names in addresses).
- web_app.py: `build_ingress_app(config, candidate_source, forwarder, auth, usage_sink,
  metrics, hosts=...)` for an aiohttp app over the same core (tests, embedding),
  `add_ingress_routes(app, ingress, openapi_body)` to mount the routes in a node's app (for
  requests on a connection the front handed over: aiohttp handlers over `Ingress.serve` /
  `ApiRoutes`,
  `read_body`; `traces_handler`, GET /v1/fabric/traces for admin keys), `host_middleware(hosts,
  keyed)` (HostGuard for an aiohttp app: the node's app has it).
- web_sink.py: `WebSink` (a StreamSink over an aiohttp request) and `web_response(reply)`.
"""

from llmfabric.front.web_app import add_ingress_routes, build_ingress_app

__all__ = ["add_ingress_routes", "build_ingress_app"]
