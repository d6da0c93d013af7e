"""The OpenAPI 3.1 description of every HTTP route an ingress node serves, at /openapi.json.

One document for the node's API port: the OpenAI-compatible routes (ingress), the read-only
node routes (node.serve.http_api: /healthz, /metrics, /v1/fabric/* views), the key and usage admin
routes (accounts.http) and the dashboard (/ui). The node's internal routes (forwarded requests
between peers, under FORWARD_PREFIX) are not part of the public API and are left out.

Request bodies list the fields we read; where we pass a body through to an engine (sampling
options, tools, engine extensions) the schema stays open (additionalProperties). A unit test
(tests/unit/apis/test_openapi.py) checks that every route mounted on a node's app is
described here, and tests/integration/test_api_fuzz.py fuzzes the ingress from this document.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from aiohttp import web

from llmfabric.accounts.policy import MAX_KEY_MODELS, MAX_RATE_LIMIT
from llmfabric.ingress.paths import PASSTHROUGH_ROUTES

OPENAPI_PATH = "/openapi.json"

_JSON = "application/json"
_ERROR = {"$ref": "#/components/schemas/Error"}
_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}
_ANY_OBJ: dict[str, Any] = {"type": "object", "additionalProperties": True}
_POS_INT_OR_NULL = {"type": ["integer", "null"], "minimum": 1}
_LIMIT = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_RATE_LIMIT}


def _errors(*codes: int) -> dict[str, Any]:
    texts = {400: "invalid request", 401: "missing or invalid API key", 403: "not allowed",
             404: "not found (unknown model or id)", 405: "method not allowed",
             409: "conflict", 413: "body too large", 429: "rate limited",
             502: "no node could serve it", 503: "no node is ready", 504: "node timed out"}
    return {str(c): {"description": texts[c],
                     "content": {_JSON: {"schema": _ERROR}}} for c in codes}


# (403: a model outside the key's allowlist; 409: an alias of several models)
_INFERENCE_ERRORS = (400, 401, 403, 404, 409, 413, 429, 502, 503, 504)


def _open_body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A request body we read some fields of and pass the rest through."""
    return {"required": True, "content": {_JSON: {"schema": {
        "type": "object", "properties": props, "required": required,
        "additionalProperties": True}}}}


def _closed_body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A request body validated field by field (extra fields are refused with 400)."""
    return {"required": True, "content": {_JSON: {"schema": {
        "type": "object", "properties": props, "required": required,
        "additionalProperties": False}}}}


def _ok(description: str, media: str = _JSON, schema: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema or _ANY_OBJ}}}


def _infer(summary: str, body: dict[str, Any], stream: bool = True,
           errors: tuple[int, ...] = _INFERENCE_ERRORS) -> dict[str, Any]:
    ok = _ok("the engine's answer")
    if stream:
        ok["content"]["text/event-stream"] = {"schema": _STR}
    return {"post": {"summary": summary, "requestBody": body,
                     "responses": {"200": ok, **_errors(*errors)}}}


_STREAM_OPTS = {"stream": _BOOL, "max_tokens": _POS_INT_OR_NULL, "temperature": _NUM,
                "top_p": _NUM, "stop": {"type": ["string", "array", "null"]},
                "stream_options": {"type": ["object", "null"]}, "user": _STR}
_MESSAGES = {"type": "array", "items": _ANY_OBJ}
# Fallback models (ingress/request_body.py), tried in order after `model`.
_MODELS = {"type": ["array", "null"], "maxItems": 4,
           "items": {"type": "string", "minLength": 1, "maxLength": 512}}

_FLEET_GET = {"responses": {"200": _ok("the view"), **_errors(401, 503)}}


def _fleet(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, **copy.deepcopy(_FLEET_GET)}}


def _passthrough() -> dict[str, Any]:
    body = _open_body({"model": _STR, "models": _MODELS}, ["model"])
    return {path: _infer(f"passed through to the engine as {fwd}", body, stream=False)
            for path, fwd in sorted(PASSTHROUGH_ROUTES.items())}


def _not_stored() -> dict[str, Any]:
    op = {"summary": "nothing is stored (store=false): always 404",
          "parameters": [{"name": "tail", "in": "path", "required": True, "schema": _STR}],
          "responses": _errors(404)}
    return {m: copy.deepcopy(op) for m in ("get", "post", "delete")}


_KEY_FIELDS = {"name": {"type": "string", "minLength": 1, "maxLength": 200},
               "owner": {"type": ["string", "null"], "minLength": 1, "maxLength": 200},
               "admin": _BOOL, "requests_per_min": _LIMIT, "tokens_per_min": _LIMIT,
               "record_trace": _BOOL,
               # Unix seconds, or "30d", "2027-01-31", ... (accounts/expiry.py)
               "expires_at": {"type": ["number", "string", "null"]},
               "models": {"type": ["array", "null"], "items": _STR, "minItems": 1,
                          "maxItems": MAX_KEY_MODELS}}
_LIMIT_FIELDS = {"requests_per_min": _LIMIT, "tokens_per_min": _LIMIT}
_ACCOUNT_ERRORS = (400, 401, 403, 404, 409, 429)

_PUBLIC: dict[str, Any] = {"security": []}  # routes without a key


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may change it)."""
    paths: dict[str, Any] = {
        "/v1/chat/completions": _infer("chat completion (OpenAI)", _open_body(
            {"model": _STR, "models": _MODELS, "messages": _MESSAGES, **_STREAM_OPTS},
            ["model", "messages"])),
        "/v1/completions": _infer("text completion (OpenAI)", _open_body(
            {"model": _STR, "models": _MODELS, "prompt": {"type": ["string", "array"]},
             **_STREAM_OPTS},
            ["model", "prompt"])),
        "/v1/embeddings": _infer("embeddings (OpenAI)", _open_body(
            {"model": _STR, "models": _MODELS, "input": {"type": ["string", "array"]}},
            ["model", "input"]),
            stream=False),
        "/v1/responses": _infer("Responses API (translated to chat, or native)", _open_body(
            {"model": _STR, "models": _MODELS, "input": {"type": ["string", "array"]},
             "instructions": _STR,
             "stream": _BOOL, "max_output_tokens": _POS_INT_OR_NULL, "store": _BOOL},
            ["model", "input"])),
        "/v1/responses/{tail}": _not_stored(),
        "/v1/messages": _infer("Anthropic Messages API (translated to chat); the key may "
                               "come in x-api-key", _open_body(
            {"model": _STR, "messages": _MESSAGES, "max_tokens": _INT,
             "system": {"type": ["string", "array"]}, "stream": _BOOL,
             "fallbacks": {"type": ["array", "null"], "maxItems": 4, "items": {
                 "type": "object", "required": ["model"], "additionalProperties": False,
                 "properties": {"model": _STR}}}},
            ["model", "messages", "max_tokens"])),
        **_passthrough(),
        "/v1/models": {"get": {"summary": "models served by the fabric (OpenAI list)",
                               "responses": {"200": _ok("model list"), **_errors(401)}}},
        "/v1/fabric/self": _fleet("this node's view of itself"),
        "/v1/fabric/nodes": _fleet("every node in the replica"),
        "/v1/fabric/models": _fleet("models and who serves them"),
        "/v1/fabric/providers": _fleet("providers (identities) and their nodes"),
        "/v1/fabric/records": _fleet("the raw signed records"),
        "/v1/fabric/links": _fleet("measured link tables of this node and its peers"),
        "/v1/fabric/keys": {
            "get": {"summary": "own keys; an admin sees all (or one owner's)",
                    "parameters": [{"name": "owner", "in": "query", "schema": _STR}],
                    "responses": {"200": _ok("key list"), **_errors(*_ACCOUNT_ERRORS)}},
            "post": {"summary": "create a key (the plaintext is shown this once)",
                     "requestBody": _closed_body(_KEY_FIELDS, ["name"]),
                     "responses": {"201": _ok("the key"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/keys/{key_id}": {"delete": {
            "summary": "revoke a key (own keys; admin any)",
            "parameters": [{"name": "key_id", "in": "path", "required": True, "schema": _STR}],
            "responses": {"200": _ok("the revoked key"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/usage": {"get": {
            "summary": "usage rows by day",
            "parameters": [{"name": n, "in": "query", "schema": _STR}
                           for n in ("key_id", "owner", "since")],
            "responses": {"200": _ok("usage rows"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/owners/{owner}/limits": {"put": {
            "summary": "limits on all of an owner's keys together (admin)",
            "parameters": [{"name": "owner", "in": "path", "required": True, "schema": _STR}],
            "requestBody": _closed_body(_LIMIT_FIELDS, []),
            "responses": {"200": _ok("the limits"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/usage/export": {"get": {
            "summary": "usage rows as CSV or JSON (non-admin keys: their owner's)",
            "parameters": [{"name": n, "in": "query", "schema": _STR}
                           for n in ("format", "key_id", "owner", "model", "since", "until")],
            "responses": {"200": _ok("CSV (text/csv) or JSON"),
                          **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/budgets": {"get": {
            "summary": "token budgets with this period's spent and held tokens",
            "responses": {"200": _ok("budget list"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/budgets/{scope}/{name}": {
            op: {"summary": f"{what} a key's, owner's or team's budget (admin)",
                 "parameters": [{"name": n, "in": "path", "required": True, "schema": _STR}
                                for n in ("scope", "name")],
                 **({"requestBody": _closed_body(
                     {"tokens": _INT, "usd": {"type": "number"},
                      "period": {"enum": ["day", "month"]}}, [])}
                    if op == "put" else {}),
                 "responses": {"200": _ok("the budget"), **_errors(*_ACCOUNT_ERRORS)}}
            for op, what in (("put", "set"), ("delete", "remove"))},
        "/v1/fabric/teams": {"get": {
            "summary": "team memberships: owner -> team (non-admin keys: their owner's)",
            "responses": {"200": _ok("membership list"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/teams/{owner}": {
            op: {"summary": f"{what} an owner's team (admin): its keys also count against "
                            "the team's budgets",
                 "parameters": [{"name": "owner", "in": "path", "required": True,
                                 "schema": _STR}],
                 **({"requestBody": _closed_body({"team": _STR}, ["team"])}
                    if op == "put" else {}),
                 "responses": {"200": _ok("the membership"), **_errors(*_ACCOUNT_ERRORS)}}
            for op, what in (("put", "set"), ("delete", "remove"))},
        "/v1/fabric/prices": {"get": {
            "summary": "model prices (USD per million tokens) for spend budgets",
            "responses": {"200": _ok("price list"), **_errors(*_ACCOUNT_ERRORS)}}},
        "/v1/fabric/prices/{model}": {
            op: {"summary": f"{what} a model's price (admin; model * for every other)",
                 "parameters": [{"name": "model", "in": "path", "required": True,
                                 "schema": _STR}],
                 **({"requestBody": _closed_body(
                     {"prompt_usd_per_mtok": {"type": "number"},
                      "completion_usd_per_mtok": {"type": "number"}},
                     ["prompt_usd_per_mtok", "completion_usd_per_mtok"])}
                    if op == "put" else {}),
                 "responses": {"200": _ok("the price"), **_errors(*_ACCOUNT_ERRORS)}}
            for op, what in (("put", "set"), ("delete", "remove"))},
        "/v1/fabric/traces": {"get": {
            "summary": "the last request traces of this ingress, newest first (admin)",
            "parameters": [{"name": "limit", "in": "query", "schema": _INT}],
            "responses": {"200": _ok("traces with their spans"), **_errors(400, 401, 403)}}},
        "/healthz": {"get": {**_PUBLIC, "summary": "liveness and this node's state",
                             "responses": {"200": _ok("ok")}}},
        "/metrics": {"get": {**_PUBLIC, "summary": "Prometheus metrics",
                             "responses": {"200": _ok("text exposition", "text/plain",
                                                      _STR)}}},
        OPENAPI_PATH: {"get": {**_PUBLIC, "summary": "this document",
                               "responses": {"200": _ok("OpenAPI 3.1")}}},
        "/ui": {"get": {**_PUBLIC, "summary": "redirects to /ui/",
                        "responses": {"308": {"description": "to /ui/"}}}},
        "/ui/": {"get": {**_PUBLIC, "summary": "the dashboard",
                         "responses": {"200": _ok("HTML", "text/html", _STR)}}},
        "/ui/{path}": {"get": {
            **_PUBLIC, "summary": "the dashboard's static files",
            "parameters": [{"name": "path", "in": "path", "required": True, "schema": _STR}],
            "responses": {"200": {"description": "a static file"}, **_errors(404)}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmfabric ingress node", "version": "1",
                 "description": "OpenAI-compatible API of an llmfabric ingress node, with its "
                                "fleet views and key administration (docs/http-api.md)."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "an API key (lf-...)"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {
                "error": {"type": "object", "additionalProperties": True, "properties": {
                    "message": _STR, "type": _STR, "code": {"type": ["string", "null"]},
                    "param": {"type": ["string", "null"]}}}}}},
        },
        "security": [{"bearer": []}],
    }


OPENAPI_BODY = orjson.dumps(openapi_document())  # served as is (the lean front too)


def add_openapi_route(app: web.Application, body: bytes = OPENAPI_BODY) -> None:
    """GET /openapi.json on an aiohttp app (the standalone ingress app and the node's):
    `body`, the document as its ingress serves it (with the Batch API's routes:
    `BatchService.openapi_body`)."""

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type=_JSON)

    app.router.add_get(OPENAPI_PATH, serve)
