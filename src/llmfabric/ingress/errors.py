"""The ingress's exception hierarchy and OpenAI-shaped error responses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson
from aiohttp import web


class IngressError(Exception):
    """Base class for ingress errors."""


class UpstreamError(IngressError):
    """An attempt on one candidate failed before any byte reached the client (retryable)."""


class UpstreamConnectError(UpstreamError):
    """The connection to the candidate could not be opened: nothing was sent to it, so the
    request may go to the same node by another path (the peer network)."""


class UpstreamBusyError(UpstreamError):
    """This ingress already has its limit of connection attempts to the candidate in flight
    and none finished in time: nothing is wrong with the node or its address (so no other
    path is tried, and the address is not marked failed); another candidate may serve."""


class ConfigError(IngressError, ValueError):
    """Invalid ingress configuration or command-line arguments."""


_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


def _type_of(status: int) -> str:
    """OpenAI's error type for a status not in _TYPES: a 4xx is the request's fault."""
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


MODEL_HEADER = "X-Fabric-Model"  # the model that answered, as the request named it


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response, independent of the HTTP server that sends it."""

    status: int
    body: bytes
    content_type: str = "application/json"
    node: str = ""  # X-Fabric-Node when set
    headers: dict[str, str] | None = None  # extra headers (Retry-After)
    model: str = ""  # X-Fabric-Model when set: the model that answered, as the request named it


def error_reply(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    return Reply(status, error_body(status, message, code, param), headers=headers)


def rate_limited(wait_s: float) -> Reply:
    """The 429 of a key past its requests/min: retry after `wait_s`, in whole seconds (at
    least 1, so a client does not come back at once)."""
    secs = max(1, math.ceil(wait_s))
    return error_reply(429, f"rate limit exceeded for this key; retry after {secs} s",
                       "rate_limit_exceeded", headers={"Retry-After": str(secs)})


def error_code(reply: Reply) -> str:
    """The OpenAI error code an error reply carries ("" when it carries none), so a metric
    counts a refusal under the code the client saw."""
    try:
        code = orjson.loads(reply.body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""
    return code if isinstance(code, str) else ""


def body_too_large(limit: int) -> Reply:
    """The answer to a request body over the ingress's `max_body_bytes` (both fronts)."""
    return error_reply(
        400, f"request body is larger than the limit of {limit} bytes", "request_too_large"
    )


def error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(status) or _type_of(status),
                "param": param,
                "code": code,
            }
        }
    )


def error_response(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        body=error_body(status, message, code, param),
        status=status,
        content_type="application/json",
        headers=headers,
    )
