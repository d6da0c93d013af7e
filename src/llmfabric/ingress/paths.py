"""Which API paths the ingress serves and which a node forwards to its engine.

Everything crosses the fabric under /v1/ (the node's HTTPS, sealed and peer handlers only
accept forwarded /v1/ paths): a client's root path such as vLLM's `/tokenize` travels as
`/v1/tokenize` and the node's engine proxy calls the engine's own path (ENGINE_PATHS).
"""

from __future__ import annotations

# Path prefix under which a node accepts forwarded inference requests (its data plane:
# node/serve/dataplane_server.py, the peer API; served by forward/engine_proxy.py).
FORWARD_PREFIX = "/v1/fabric/forward"

# Client path -> forwarded path, for the routes passed through unchanged to an engine that
# serves them (vLLM, SGLang): routed by the body's model, authenticated, and metered by
# request when no usage comes back.
PASSTHROUGH_ROUTES = {
    "/v1/rerank": "/v1/rerank", "/rerank": "/v1/rerank",
    "/v1/score": "/v1/score", "/score": "/v1/score",
    "/tokenize": "/v1/tokenize", "/detokenize": "/v1/detokenize",
}
PASSTHROUGH_PATHS = frozenset(PASSTHROUGH_ROUTES)  # as clients call them
METERED_BY_REQUEST = frozenset(PASSTHROUGH_ROUTES.values())  # as forwarded
# Forwarded path -> the engine's path, where they differ.
ENGINE_PATHS = {"/v1/tokenize": "/tokenize", "/v1/detokenize": "/detokenize"}
# Engine-native Responses API (passed through for the models configured as native).
NATIVE_RESPONSES_PATH = "/v1/responses"
# Everything a node's engine proxy forwards to its local engine.
FORWARDABLE_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", NATIVE_RESPONSES_PATH,
    *METERED_BY_REQUEST,
})
