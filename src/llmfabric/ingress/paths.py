"""Which API paths the ingress serves and which a node forwards to its engine."""

from __future__ import annotations

# Passed through unchanged to an engine that serves them (vLLM, SGLang): routed by the body's
# model, authenticated, metered by request when no usage comes back.
PASSTHROUGH_PATHS = frozenset({
    "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score", "/tokenize", "/detokenize",
})
# Engine-native Responses API (passed through for the models configured as native).
NATIVE_RESPONSES_PATH = "/v1/responses"
# Everything a node's engine proxy forwards to its local engine.
FORWARDABLE_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", NATIVE_RESPONSES_PATH,
    *PASSTHROUGH_PATHS,
})
