"""The Batch API's routes in OpenAPI 3.1 (`batch_paths`), kept here because the ingress's
document (llmfabric.apis.openapi) may not import this package; `openapi_document()`
is the ingress's document with them. `BatchService.openapi_body` is that document as its
ingress's fronts serve it at /openapi.json."""

from __future__ import annotations

from typing import Any

from llmfabric.apis.openapi import openapi_document as ingress_document
from llmfabric.batch.limits import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    FILE_PURPOSE,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
)
from llmfabric.batch.retention import MAX_EXPIRES_AFTER_S, MIN_EXPIRES_AFTER_S

_JSON = "application/json"
_ERROR = {"$ref": "#/components/schemas/Error"}
_OBJ: dict[str, Any] = {"type": "object", "additionalProperties": True}
_TEXTS = {400: "invalid request", 401: "missing or invalid API key", 404: "not found (an "
          "unknown id, or another owner's)", 409: "conflict (in use, or ended)",
          413: "file or line too large", 429: "the key's (or its owner's) requests/min for "
          "the Files and Batches routes is used up (Retry-After says when to ask again)"}


def _op(summary: str, *errors: int, ok: str = "the object", **extra: Any) -> dict[str, Any]:
    return {"summary": summary, **extra, "responses": {
        "200": {"description": ok, "content": {_JSON: {"schema": _OBJ}}},
        **{str(c): {"description": _TEXTS[c], "content": {_JSON: {"schema": _ERROR}}}
           for c in (401, 429, *errors)}}}


def _id(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}]


def _query(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
            for n in names]


def batch_paths() -> dict[str, Any]:
    """The Files and Batches routes (files_api.py, batches_api.py)."""
    seconds = {"type": "integer", "minimum": MIN_EXPIRES_AFTER_S,
               "maximum": MAX_EXPIRES_AFTER_S}
    upload = {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"], "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"type": "string", "enum": [FILE_PURPOSE]},
            "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
            "expires_after[seconds]": seconds}}}}}
    create = {"required": True, "content": {_JSON: {"schema": {
        "type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": {"type": "string"},
            "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
            "completion_window": {"type": "string", "enum": list(COMPLETION_WINDOWS)},
            "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA_PAIRS,
                         "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
                         "additionalProperties": {"type": "string",
                                                  "maxLength": MAX_METADATA_VALUE_CHARS}},
            "output_expires_after": {"type": "object", "required": ["anchor", "seconds"],
                                     "properties": {"anchor": {"enum": ["created_at"]},
                                                    "seconds": seconds}}}}}}}
    return {
        "/v1/files": {
            "post": _op("upload a batch input file (JSONL)", 400, 413, requestBody=upload),
            "get": _op("the caller's files", 400, ok="a list page",
                       parameters=_query("purpose", "after", "limit", "order"))},
        "/v1/files/{id}": {
            "get": _op("a file", 404, parameters=_id("id")),
            "delete": _op("delete a file", 404, 409, parameters=_id("id"))},
        "/v1/files/{id}/content": {
            "get": {**_op("a file's bytes", 404, parameters=_id("id")), "responses": {
                "200": {"description": "the file", "content": {
                    "application/octet-stream": {"schema": {"type": "string"}}}},
                **{str(c): {"description": _TEXTS[c], "content": {_JSON: {"schema": _ERROR}}}
                   for c in (401, 404, 429)}}}},
        "/v1/batches": {
            "post": _op("create a batch", 400, 404, 413, requestBody=create),
            "get": _op("the caller's batches", 400, ok="a list page",
                       parameters=_query("after", "limit"))},
        "/v1/batches/{id}": {"get": _op("a batch", 404, parameters=_id("id"))},
        "/v1/batches/{id}/cancel": {"post": _op("cancel a batch", 404, 409,
                                                parameters=_id("id"))},
    }


def openapi_document() -> dict[str, Any]:
    """The ingress's document with the Batch API's routes."""
    doc = ingress_document()
    doc["paths"].update(batch_paths())
    return doc
