"""The APIs beside chat completions, translated onto `Ingress.serve`, and the route catalog.

An edge of the request core (llmfabric.ingress), ranked above it: everything here calls
`Ingress.serve` (auth, routing, retries, streaming, usage) and the core never imports it.
The HTTP servers (llmfabric.front) build an `ApiRoutes` over their ingress and serve the
OpenAPI document they are given.

Files:
- api_routes.py: `ApiRoutes(ingress)` (each front's): POST /v1/responses, /v1/messages and
  the pass-through paths over `Ingress.serve`; errors reshaped per API; `EXTRA_POST_PATHS`.
- responses_api.py: the Responses API <-> chat completions (stateless, `store=false`),
  `ResponsesStream` (its event stream); `TranslationError` (-> 400).
- anthropic_api.py: Anthropic Messages <-> chat completions, `MessagesStream`,
  `anthropic_error`.
- chat_stream.py: `ChatStreamTranslator`, a StreamSink that parses chat SSE chunks for the
  translated APIs' streams.
- openapi.py: `openapi_document()`, the OpenAPI 3.1 description of every route an ingress
  node serves, `OPENAPI_BODY` (served as is) and `add_openapi_route(app, body)` (GET
  /openapi.json on an aiohttp app; with the Batch API mounted beside, the body is
  `BatchService.openapi_body`).
"""
