"""The APIs beside chat completions, translated onto `Ingress.serve`, and the route catalog.

Files:
- api_routes.py: `ApiRoutes` (`Ingress.api`): POST /v1/responses, /v1/messages and the
  pass-through paths over `Ingress.serve`; errors reshaped per API.
- responses_api.py: the Responses API <-> chat completions (stateless, `store=false`),
  `ResponsesStream` (its event stream); `TranslationError` (-> 400).
- anthropic_api.py: Anthropic Messages <-> chat completions, `MessagesStream`,
  `anthropic_error`.
- chat_stream.py: `ChatStreamTranslator`, a StreamSink that parses chat SSE chunks for the
  translated APIs' streams.
- openapi.py: `openapi_document()`, the OpenAPI 3.1 description of every route an ingress
  node serves, and `add_openapi_route(app, body)` (GET /openapi.json,
  the document as its ingress serves it: `Ingress.openapi_body`, which `Ingress.describe`
  extends with routes mounted beside, the Batch API's).
"""
