"""HTTP routes for API keys and usage that the ingress mounts (docs/accounts.md).

    GET    /v1/fabric/keys[?owner=]       own keys; an admin sees all (or one owner's)
    POST   /v1/fabric/keys                {name, owner?, admin?, requests_per_min?,
                                           tokens_per_min?, record_trace?, expires_at?,
                                           models?} -> key + "key" (the plaintext, shown
                                          this once); expires_at: Unix seconds or text as
                                          `keys create --expires` takes it (30d, 2027-01-31)
    DELETE /v1/fabric/keys/{id}           revoke (own keys; admin any)
    GET    /v1/fabric/usage[?key_id=&owner=&since=YYYY-MM-DD]
    PUT    /v1/fabric/owners/{owner}/limits {requests_per_min?, tokens_per_min?} (admin):
                                          limits on all of an owner's keys together

A non-admin key creates keys only for its own owner, never with higher limits, a later
expiry or more models than its own (unset ones inherit its own); owner "admin" is reserved
for admin keys; an owner holds at most 100 active keys (accounts.policy). An expired key
gets 401 `expired_api_key`, saying when it expired.

Every route needs `Authorization: Bearer <api key>`; errors use OpenAI's JSON error shape.
"""

from __future__ import annotations

from typing import Any

import orjson
import pydantic
from aiohttp import web

from llmfabric.accounts.errors import InvalidRequest, KeyNotFound, PermissionDenied
from llmfabric.accounts.expiry import expired_message, parse_expiry
from llmfabric.accounts.export import is_utc_day
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.policy import MAX_KEY_MODELS, MAX_RATE_LIMIT
from llmfabric.accounts.store import AccountStore


class CreateKeyBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(min_length=1, max_length=200)
    owner: str | None = pydantic.Field(default=None, min_length=1, max_length=200)
    admin: bool = False
    requests_per_min: int | None = pydantic.Field(default=None, gt=0, le=MAX_RATE_LIMIT)
    tokens_per_min: int | None = pydantic.Field(default=None, gt=0, le=MAX_RATE_LIMIT)
    record_trace: bool = True
    expires_at: float | str | None = None  # Unix seconds, or as accounts.expiry reads it
    models: list[str] | None = pydantic.Field(default=None, min_length=1,
                                              max_length=MAX_KEY_MODELS)


class OwnerLimitsBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    requests_per_min: int | None = pydantic.Field(default=None, gt=0, le=MAX_RATE_LIMIT)
    tokens_per_min: int | None = pydantic.Field(default=None, gt=0, le=MAX_RATE_LIMIT)


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _err(status: int, message: str, type_: str, code: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return json_response(error_body(message, type_, code), status, headers)


def bearer_token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def add_account_routes(app: web.Application, store: AccountStore) -> None:
    async def caller(request: web.Request) -> ApiKey | web.Response:
        token = bearer_token(request)
        key = await store.authenticate(token) if token else None
        if key is None:
            if token and (at := store.expired_at(token)) is not None:
                return _err(401, expired_message(at), "invalid_request_error",
                            "expired_api_key")
            return _err(
                401,
                "missing or invalid API key; pass it as 'Authorization: Bearer lf-...'",
                "invalid_request_error",
                "invalid_api_key",
            )
        return key

    async def list_keys(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        owner = request.query.get("owner")
        if not me.admin:
            if owner is not None and owner != me.owner:
                return _err(403, "only an admin may list other owners' keys",
                            "permission_error", "forbidden")
            owner = me.owner
        keys = await store.list_keys(owner=owner)
        return json_response({"object": "list", "data": [k.to_json() for k in keys]})

    async def create_key(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        try:
            body = CreateKeyBody.model_validate_json(await request.read())
        except pydantic.ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"msg": "invalid body", "loc": ()}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return _err(400, f"invalid key request: {where}: {first['msg']}",
                        "invalid_request_error", "invalid_body")
        owner = body.owner or me.owner
        if body.owner is None and me.admin and not body.admin:
            return _err(400, "name the owner of the new key (owner 'admin' is reserved for "
                        "admin keys)", "invalid_request_error", "invalid_body")
        if not me.admin and (owner != me.owner or body.admin):
            return _err(403, "only an admin may create admin keys or keys for other owners",
                        "permission_error", "forbidden")
        try:
            expires_at = (parse_expiry(body.expires_at, store.now())
                          if isinstance(body.expires_at, str) else body.expires_at)
            key, plaintext = await store.create_key(
                body.name, owner, admin=body.admin, requests_per_min=body.requests_per_min,
                tokens_per_min=body.tokens_per_min, record_trace=body.record_trace,
                expires_at=expires_at, models=body.models, by=me,
            )
        except InvalidRequest as exc:
            return _err(400, str(exc), "invalid_request_error", "invalid_body")
        except PermissionDenied as exc:
            return _err(403, str(exc), "permission_error", "forbidden")
        return json_response({**key.to_json(), "key": plaintext}, 201)

    async def revoke_key(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        try:
            key = await store.revoke(request.match_info["key_id"], by=me)
        except KeyNotFound as exc:
            return _err(404, str(exc), "invalid_request_error", "key_not_found")
        except PermissionDenied as exc:
            return _err(403, str(exc), "permission_error", "forbidden")
        return json_response(key.to_json())

    async def usage(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        q = request.query
        since = q.get("since")
        if since is not None and not is_utc_day(since):
            return _err(400, "since must be a UTC day YYYY-MM-DD", "invalid_request_error",
                        "invalid_parameter")
        owner = q.get("owner")
        key_id = q.get("key_id")
        if not me.admin:
            if owner is not None and owner != me.owner:
                return _err(403, "only an admin may read other owners' usage",
                            "permission_error", "forbidden")
            owner = me.owner
        rows = await store.usage(key_id=key_id, owner=owner, since_day=since)
        return json_response({"object": "list", "data": [r.to_json() for r in rows]})

    async def owner_limits(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        if not me.admin:
            return _err(403, "only an admin may set owner limits", "permission_error",
                        "forbidden")
        try:
            body = OwnerLimitsBody.model_validate_json(await request.read())
        except pydantic.ValidationError:
            return _err(400, "limits must be positive integers or null", "invalid_request_error",
                        "invalid_body")
        owner = request.match_info["owner"]
        await store.set_owner_limits(owner, body.requests_per_min, body.tokens_per_min)
        return json_response({"owner": owner, "requests_per_min": body.requests_per_min,
                              "tokens_per_min": body.tokens_per_min})

    app.router.add_put("/v1/fabric/owners/{owner}/limits", owner_limits)
    app.router.add_get("/v1/fabric/keys", list_keys)
    app.router.add_post("/v1/fabric/keys", create_key)
    app.router.add_delete("/v1/fabric/keys/{key_id}", revoke_key)
    app.router.add_get("/v1/fabric/usage", usage)
