"""HTTP routes for budgets and usage export that the ingress mounts (docs/accounts.md):

    GET    /v1/fabric/budgets                 budgets with this period's spent and held
                                              amounts (admin: all; others: own key's,
                                              owner's, owner's team's)
    PUT    /v1/fabric/budgets/{scope}/{name}  {tokens | usd, period: day|month} (admin;
                                              scope: key | owner | team)
    DELETE /v1/fabric/budgets/{scope}/{name}  (admin)
    GET    /v1/fabric/prices                  model prices for spend budgets
    PUT    /v1/fabric/prices/{model}          {prompt_usd_per_mtok, completion_usd_per_mtok}
                                              (admin; model "*": every unpriced model)
    DELETE /v1/fabric/prices/{model}          (admin)
    GET    /v1/fabric/teams                   owner -> team (admin: all; others: own)
    PUT    /v1/fabric/teams/{owner}           {team} (admin): the owner's keys also count
                                              against the team's budgets
    DELETE /v1/fabric/teams/{owner}           (admin)
    GET    /v1/fabric/usage/export?format=csv|json&key_id=&owner=&model=&since=&until=
                                              (non-admin keys: their owner's rows only)
"""

from __future__ import annotations

import pydantic
from aiohttp import web

from llmfabric.accounts.budgets import BudgetStore, validate_budget
from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.export import ExportFilter, content_type, stream
from llmfabric.accounts.http import bearer_token, error_body, json_response
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.prices import validate_price
from llmfabric.accounts.store import AccountStore


class BudgetBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    tokens: int | None = pydantic.Field(default=None, gt=0)
    usd: float | None = pydantic.Field(default=None, gt=0, allow_inf_nan=False)
    period: str = "day"


class TeamBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    team: str = pydantic.Field(min_length=1, max_length=200)


class PriceBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    prompt_usd_per_mtok: float = pydantic.Field(ge=0, allow_inf_nan=False)
    completion_usd_per_mtok: float = pydantic.Field(ge=0, allow_inf_nan=False)


def _err(status: int, message: str, code: str) -> web.Response:
    kind = {401: "invalid_request_error", 403: "permission_error"}.get(
        status, "invalid_request_error")
    return json_response(error_body(message, kind, code), status)


def add_tenancy_routes(app: web.Application, store: AccountStore,
                       budgets: BudgetStore | None) -> None:
    async def caller(request: web.Request) -> ApiKey | web.Response:
        token = bearer_token(request)
        key = await store.authenticate(token) if token else None
        if key is None:
            return _err(401, "missing or invalid API key", "invalid_api_key")
        return key

    async def list_budgets(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        rows: list[dict[str, object]] = []
        if budgets is not None:
            rows = (budgets.book.status() if me.admin
                    else budgets.book.status_for(me.id, me.owner, me.issuer))
        return json_response({"object": "list", "enforced": budgets is not None, "data": rows})

    async def admin_budget(request: web.Request, *names: str) -> web.Response | tuple[str, ...]:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        if not me.admin:
            return _err(403, "only an admin may set budgets", "forbidden")
        if budgets is None:
            return _err(400, "budgets are not enforced by this ingress", "budgets_disabled")
        return tuple(request.match_info[n] for n in names or ("scope", "name"))

    async def put_budget(request: web.Request) -> web.Response:
        got = await admin_budget(request)
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        try:
            body = BudgetBody.model_validate_json(await request.read())
            budget = validate_budget(got[0], got[1], body.tokens, body.period, body.usd)
        except pydantic.ValidationError:
            return _err(400, "a budget is {tokens: positive integer | usd: positive number, "
                        "period: day|month}", "invalid_body")
        except InvalidRequest as exc:
            return _err(400, str(exc), "invalid_body")
        await budgets.put(budget)
        return json_response(budget.to_json())

    async def delete_budget(request: web.Request) -> web.Response:
        got = await admin_budget(request)
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        if not await budgets.delete(*got):
            return _err(404, f"no budget for {got[0]} {got[1]!r}", "budget_not_found")
        return json_response({"scope": got[0], "name": got[1], "deleted": True})

    async def export(request: web.Request) -> web.StreamResponse:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        q = request.query
        owner = q.get("owner")
        if not me.admin:
            if owner is not None and owner != me.owner:
                return _err(403, "only an admin may export other owners' usage", "forbidden")
            owner = me.owner
        fmt = q.get("format", "json")
        try:
            flt = ExportFilter(q.get("key_id"), owner, q.get("model"), q.get("since"),
                               q.get("until"))
            ctype = content_type(fmt)
        except InvalidRequest as exc:
            return _err(400, str(exc), "invalid_parameter")
        # Streamed a batch of rows at a time (export.stream): memory stays at one batch
        # however large the export. The first piece comes once the database answered, so
        # a database error is still a 500 before anything is sent; one later cuts the
        # (chunked) body short, which a client sees as an incomplete transfer.
        pieces = stream(store.usage_pages, store.usage_totals, flt, fmt)
        try:
            first = await anext(pieces)
            resp = web.StreamResponse(headers={"Content-Type": ctype})
            if ctype == "text/csv":
                resp.headers["Content-Disposition"] = 'attachment; filename="usage.csv"'
            await resp.prepare(request)
            await resp.write(first)
            async for piece in pieces:
                await resp.write(piece)
            await resp.write_eof()
        finally:
            await pieces.aclose()
        return resp

    async def list_prices(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        prices = budgets.book.prices if budgets is not None else {}
        return json_response({"object": "list", "data": [
            {"model": m, **p.to_json()} for m, p in sorted(prices.items())]})

    async def put_price(request: web.Request) -> web.Response:
        got = await admin_budget(request, "model")
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        model = got[0]
        try:
            body = PriceBody.model_validate_json(await request.read())
            price = validate_price(model, body.prompt_usd_per_mtok,
                                   body.completion_usd_per_mtok)
        except pydantic.ValidationError:
            return _err(400, "a price is {prompt_usd_per_mtok, completion_usd_per_mtok}: "
                        "numbers >= 0", "invalid_body")
        except InvalidRequest as exc:
            return _err(400, str(exc), "invalid_body")
        await budgets.put_price(model, price)
        return json_response({"model": model, **price.to_json()})

    async def delete_price(request: web.Request) -> web.Response:
        got = await admin_budget(request, "model")
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        if not await budgets.delete_price(got[0]):
            return _err(404, f"no price for model {got[0]!r}", "price_not_found")
        return json_response({"model": got[0], "deleted": True})

    async def list_teams(request: web.Request) -> web.Response:
        me = await caller(request)
        if isinstance(me, web.Response):
            return me
        teams = budgets.book.teams if budgets is not None else {}
        rows = [{"owner": o, "team": t} for o, t in sorted(teams.items())
                if me.admin or o == me.owner]
        return json_response({"object": "list", "data": rows})

    async def put_team(request: web.Request) -> web.Response:
        got = await admin_budget(request, "owner")
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        try:
            body = TeamBody.model_validate_json(await request.read())
            await budgets.put_team(got[0], body.team)
        except pydantic.ValidationError:
            return _err(400, "a team membership is {team: 1..200 characters}", "invalid_body")
        except InvalidRequest as exc:
            return _err(400, str(exc), "invalid_body")
        return json_response({"owner": got[0], "team": body.team})

    async def delete_team(request: web.Request) -> web.Response:
        got = await admin_budget(request, "owner")
        if isinstance(got, web.Response):
            return got
        assert budgets is not None
        if not await budgets.delete_team(got[0]):
            return _err(404, f"owner {got[0]!r} is in no team", "team_not_found")
        return json_response({"owner": got[0], "deleted": True})

    app.router.add_get("/v1/fabric/teams", list_teams)
    app.router.add_put("/v1/fabric/teams/{owner}", put_team)
    app.router.add_delete("/v1/fabric/teams/{owner}", delete_team)
    app.router.add_get("/v1/fabric/prices", list_prices)
    app.router.add_put("/v1/fabric/prices/{model}", put_price)
    app.router.add_delete("/v1/fabric/prices/{model}", delete_price)
    app.router.add_get("/v1/fabric/budgets", list_budgets)
    app.router.add_put("/v1/fabric/budgets/{scope}/{name}", put_budget)
    app.router.add_delete("/v1/fabric/budgets/{scope}/{name}", delete_budget)
    app.router.add_get("/v1/fabric/usage/export", export)
