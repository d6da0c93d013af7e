"""What the Files and Batches routes share: who calls (`Caller`, `callers_of`: the owner
of the caller's API key, scoped by its issuer when another ingress issued it (`owner_of`),
"" on an ingress without keys), OpenAI-shaped replies and list
pages, and the Host check of the batch app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from llmfabric.accounts.models import ApiKey
from llmfabric.front.host_check import HostGuard
from llmfabric.front.web_sink import web_response
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import Reply, error_reply, rate_limited
from llmfabric.ingress.protocols import Principal

BATCH_PREFIXES = ("/v1/files", "/v1/batches")
DRAINED_BYTES = 1 << 20  # a refused body up to this size is read, not cut (`refused_unread`)
ISSUER_SEP = "\x1f"  # between a granted key's issuer and its owner (`owner_of`)
# Ends the bucket names of a key's Files and Batches calls (`_managing`; not printable, so
# no key id or owner name holds it: accounts/policy.py)
MANAGING_SEP = "\x1ebatch-api"


@dataclass(frozen=True, slots=True)
class Caller:
    owner: str  # whose files and batches these are ("": an ingress without API keys)
    key_id: str  # the key that called ("" without keys): a batch runs as this key


Identify = Callable[[str], Awaitable["Caller | web.Response"]]


def callers_of(ingress: Ingress) -> Identify:
    """The caller of a request from its Authorization header, through the ingress's own
    authenticator: a 401 reply when the key is missing or not valid (`expired_api_key`,
    saying when, for an expired one, as on the inference routes), a 429 with Retry-After
    when the key (or its owner) is past its requests/min for these routes (`_managing`: an
    allowance of their own; a key could poll, list or be refused as fast as the front took
    requests)."""
    auth = ingress.auth

    async def identify(header: str) -> Caller | web.Response:
        if auth is None:
            return Caller("", "")
        principal = await ingress.authenticate_header(header)
        if isinstance(principal, Reply):
            return web_response(principal)
        if (wait := auth.check_rate(_managing(principal))) is not None:
            return web_response(rate_limited(wait))
        return Caller(owner_of(principal), principal.id)

    return identify


def _managing(principal: Principal) -> Principal:
    """The key as its Files and Batches calls are rate limited: the key's and its owner's
    requests/min, in buckets of their own. A batch's lines are requests of the key itself
    and take its allowance: polling a running batch must not take from its lines (or be
    refused because they took it all), nor its lines wait behind the polling."""
    if not isinstance(principal, ApiKey):
        return principal  # (an authenticator without limits of this kind)
    return replace(principal, id=principal.id + MANAGING_SEP,
                   owner=principal.owner + MANAGING_SEP)


def owner_of(principal: Principal) -> str:
    """Whose files and batches a key's are: its owner, scoped by the ingress that issued it
    when another did (a key accepted through a grant, accounts/grants.py), so owner "alice"
    of another ingress does not share local alice's. (The separator is not printable: no
    local owner name holds it, accounts/policy.py.)"""
    owner = getattr(principal, "owner", None)
    name = owner if isinstance(owner, str) else principal.id
    issuer = getattr(principal, "issuer", "")
    return f"{issuer}{ISSUER_SEP}{name}" if isinstance(issuer, str) and issuer else name


def fail(status: int, message: str, code: str, param: str | None = None) -> web.Response:
    return web_response(error_reply(status, message, code, param))


def ok(doc: Mapping[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


async def closing(request: web.Request, reply: web.Response) -> web.Response:
    """`reply` to a request whose body was refused before its end: sent, then the
    connection closed, so no more of the body is read (aiohttp's lingering close would
    read and drop it for 10 s more: 11.7 GB over loopback)."""
    if request.content.at_eof():
        return reply
    await reply.prepare(request)
    await reply.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()  # (the reply is written: the transport flushes it)
    return reply


async def refused_unread(request: web.Request, reply: web.Response,
                         drained: int = DRAINED_BYTES) -> web.Response:
    """`reply` to a request refused before its body was read: a body of a stated length up
    to `drained` bytes is read and dropped first (a client still sending it would get a
    reset, not the reply); any other (chunked, or larger) is not read: the connection
    closes (`closing`)."""
    if request.content_length is not None and request.content_length <= drained:
        await request.release()
        return reply
    return await closing(request, reply)


def list_page(data: list[dict[str, Any]], has_more: bool) -> web.Response:
    return ok({"object": "list", "data": data,
               "first_id": data[0]["id"] if data else None,
               "last_id": data[-1]["id"] if data else None, "has_more": has_more})


def page_args(query: Mapping[str, str], default_limit: int, max_limit: int
              ) -> tuple[str | None, int] | web.Response:
    """(after, limit) of a list request, or the 400 for a bad limit."""
    raw = query.get("limit", str(default_limit))
    # (ASCII digits only: str.isdigit takes '²', which int() refuses, and 5,000 digits
    # pass int()'s limit on a string's length)
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= max_limit:
        return fail(400, f"'limit' is an integer from 1 to {max_limit}", "invalid_request",
                    "limit")
    return query.get("after") or None, int(raw)


def host_middleware(hosts: HostGuard, keyed: bool) -> Middleware:
    """The Host and cross-site check of the batch app (front/host_check.py); with API keys the
    batch routes authenticate every request, as the OpenAI routes do, and are exempt."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        h = request.headers
        refused = hosts.refusal(h.get("Host", ""), request.method, h.get("Origin"),
                                h.get("Sec-Fetch-Site"),
                                keyed and request.path.startswith(BATCH_PREFIXES))
        if refused is not None:
            return web_response(refused)
        return await handler(request)

    return check
