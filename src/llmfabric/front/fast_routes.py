"""Which requests the lean front (fast_front.py) answers itself: the OpenAI routes, GET
/v1/models, /openapi.json and (standalone) /metrics. Everything else is either an OpenAI-shaped
404, or, on a front with a fallback server (a fabric node's aiohttp app: dashboard, fleet API,
accounts, /metrics), handed over to that server with its connection (`owned` says which)."""

from __future__ import annotations

from llmfabric.apis.api_routes import EXTRA_POST_PATHS, not_stored
from llmfabric.front.fast_wire import not_allowed
from llmfabric.ingress.errors import Reply, error_reply

POST_ROUTES = {
    b"/v1/chat/completions": ("/v1/chat/completions", True),
    b"/v1/completions": ("/v1/completions", True),
    b"/v1/embeddings": ("/v1/embeddings", False),
    **{p.encode(): (p, True) for p in EXTRA_POST_PATHS},  # served by ApiRoutes (llmfabric.apis)
}
_GET_ROUTES = frozenset({b"/v1/models", b"/openapi.json"})


def owned(path: bytes, serve_metrics: bool) -> bool:
    """Whether the front answers `path` itself (any method: a wrong one gets 405 here)."""
    return (path in POST_ROUTES or path in _GET_ROUTES or path.startswith(b"/v1/responses/")
            or (serve_metrics and path == b"/metrics"))


def api_path(path: str) -> bool:
    """Whether `path` is an OpenAI API route (each needs a key on an ingress with keys):
    exempt from the Host check there (host_check.py)."""
    return owned(path.encode("latin-1", "replace"), False)


def route(path: bytes, method: bytes, serve_metrics: bool, openapi: bytes
          ) -> tuple[str, bool] | Reply | None:
    """(path, streamable) for an OpenAI POST; a Reply for errors and /openapi.json (its body:
    `openapi`); None for GET /v1/models and /metrics (answered by the front)."""
    hit = POST_ROUTES.get(path)
    if hit is not None:
        if method == b"POST":
            return hit
        return not_allowed(path, "POST")
    if path.startswith(b"/v1/responses/"):
        return not_stored()
    if path == b"/openapi.json":
        return (Reply(200, openapi, "application/json") if method == b"GET"
                else not_allowed(path, "GET"))
    if path == b"/v1/models" or (path == b"/metrics" and serve_metrics):
        return None if method == b"GET" else not_allowed(path, "GET")
    return error_reply(404, f"no route {path.decode('latin-1')!r}; the API is under /v1 "
                       "(chat/completions, completions, embeddings, responses, messages, "
                       "models; the whole API: /openapi.json)", "not_found")
