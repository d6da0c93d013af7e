"""`llmfabric keys budget set|list|rm|team|price`: budgets, teams and prices in the local
accounts database.

The same as `PUT /v1/fabric/budgets/{scope}/{name}`, `/v1/fabric/teams/{owner}` and
`/v1/fabric/prices/{model}` (docs/accounts.md), written straight to the database as the
local operator: the way to set them for a standalone `llmfabric ingress`, which serves no
admin routes. Running ingresses on that database pick a change up within their budget sync
(2 s).
"""

from __future__ import annotations

import json
import time

import click

from llmfabric.accounts import AccountStore
from llmfabric.accounts.budgets import (
    SCOPES,
    Budget,
    BudgetBook,
    BudgetStore,
    validate_budget,
    validate_team,
)
from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.prices import validate_price
from llmfabric.cli.apikeys import _with_store, db_option


async def _budgets(store: AccountStore) -> BudgetStore:
    budgets = BudgetStore(store.backend, BudgetBook(time.time))
    await budgets.load()
    return budgets


@click.group("budget")
def budget_group() -> None:
    """Token or spend budgets per key, owner or team (per UTC day or month)."""


@budget_group.command("set")
@click.argument("scope", type=click.Choice(SCOPES))
@click.argument("name")
@click.option("--tokens", type=click.IntRange(min=1), default=None,
              help="tokens (prompt + completion) allowed per period")
@click.option("--usd", type=click.FloatRange(min=0, min_open=True), default=None,
              help="spend allowed per period, in USD (at the prices of /v1/fabric/prices)")
@click.option("--period", type=click.Choice(["day", "month"]), default="day",
              show_default=True, help="the budget renews each UTC day (at 00:00 UTC) or "
              "UTC month (on the 1st)")
@db_option
def set_budget(scope: str, name: str, tokens: int | None, usd: float | None, period: str,
               db_url: str | None) -> None:
    """Set the budget of SCOPE NAME (a key id, an owner or a team); replaces any other."""
    if (tokens is None) == (usd is None):  # (the API said "in tokens or in usd")
        raise click.UsageError("give exactly one of --tokens N and --usd AMOUNT: a budget is "
                               "in tokens or in USD")
    try:
        budget = validate_budget(scope, name, tokens, period, usd=usd)
    except InvalidRequest as exc:
        raise click.UsageError(str(exc)) from exc

    async def put(store: AccountStore) -> None:
        await (await _budgets(store)).put(budget)

    _with_store(db_url, put)
    click.echo(budget_set_text(budget))


# Whose spending a budget bounds, by scope.
_WHOSE = {"key": "API key {name!r}", "owner": "owner {name!r} (all their API keys together)",
          "team": "team {name!r} (the API keys of all its members together)"}
_PERIOD = {"day": "UTC day, renewed at 00:00 UTC",
           "month": "UTC month, renewed on the 1st at 00:00 UTC"}


def budget_set_text(budget: Budget) -> str:
    """What `budget set` set, said plainly: for whom, how much, per which period."""
    amount = (f"{budget.limit:,} tokens (prompt + completion)" if budget.unit == "tokens"
              else f"{budget.show(budget.limit)} of spend (at the prices `keys budget price` "
              "sets)")
    return (f"budget set for {_WHOSE[budget.scope].format(name=budget.name)}: at most "
            f"{amount} per {_PERIOD[budget.period]} (replaces any earlier budget)")


@budget_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@db_option
def list_budgets(as_json: bool, db_url: str | None) -> None:
    """Budgets with what the ledger holds as spent this period (every ingress that writes
    to this database; requests in flight and usage not flushed yet are not in it)."""

    async def everything(store: AccountStore) -> tuple[list[dict[str, object]],
                                                       dict[str, str], dict[str, object]]:
        book = (await _budgets(store)).book
        return book.status(), dict(book.teams), {m: p.to_json() for m, p in book.prices.items()}

    rows, teams, prices = _with_store(db_url, everything, existing=True)
    if as_json:
        click.echo(json.dumps({"budgets": rows, "teams": teams, "prices": prices}))
        return
    if not rows:
        click.echo("no budgets")
    for r in rows:
        limit = r.get("tokens", r.get("usd"))
        unit = "tokens" if "tokens" in r else "USD"
        spent = r["spent"] if unit == "tokens" else int(str(r["spent"])) / 1e6
        click.echo(f"{r['scope']:<6} {r['name']:<24} {limit} {unit} per {r['period']}, "
                   f"spent {spent} in {r['period_id']}")
    for owner, team in sorted(teams.items()):
        click.echo(f"team   {team:<24} member {owner}")
    for model, price in sorted(prices.items()):
        click.echo(f"price  {model:<24} {json.dumps(price)}")


@budget_group.command("rm")
@click.argument("scope", type=click.Choice(SCOPES))
@click.argument("name")
@db_option
def remove_budget(scope: str, name: str, db_url: str | None) -> None:
    """Remove the budget of SCOPE NAME."""

    async def delete(store: AccountStore) -> bool:
        return await (await _budgets(store)).delete(scope, name)

    if not _with_store(db_url, delete, existing=True):
        raise click.ClickException(f"no budget for {scope} {name!r}")
    click.echo(f"removed the budget of {scope} {name!r}")


@budget_group.command("team")
@click.argument("owner")
@click.argument("team", required=False)
@click.option("--remove", is_flag=True, help="take OWNER out of its team")
@db_option
def team(owner: str, team: str | None, remove: bool, db_url: str | None) -> None:
    """Put OWNER in TEAM (its keys then count for the team's budget too), or --remove it."""
    if remove == (team is not None):
        raise click.UsageError("give TEAM, or --remove (not both)")
    if team is not None:
        try:
            validate_team(owner, team)
        except InvalidRequest as exc:
            raise click.UsageError(str(exc)) from exc

    async def change(store: AccountStore) -> bool:
        budgets = await _budgets(store)
        if team is None:
            return await budgets.delete_team(owner)
        await budgets.put_team(owner, team)
        return True

    if not _with_store(db_url, change):
        raise click.ClickException(f"owner {owner!r} is in no team")
    click.echo(f"owner {owner!r} is now in team {team!r}" if team else
               f"owner {owner!r} left its team")


@budget_group.command("price")
@click.argument("model")
@click.option("--prompt-usd", type=float, default=None, help="USD per million prompt tokens")
@click.option("--completion-usd", type=float, default=None,
              help="USD per million completion tokens")
@click.option("--remove", is_flag=True, help="remove MODEL's price")
@db_option
def price(model: str, prompt_usd: float | None, completion_usd: float | None, remove: bool,
          db_url: str | None) -> None:
    """Price MODEL for spend budgets ("*": every model without its own price), or --remove."""
    if remove:
        if prompt_usd is not None or completion_usd is not None:
            raise click.UsageError("--remove takes no prices")

        async def delete(store: AccountStore) -> bool:
            return await (await _budgets(store)).delete_price(model)

        if not _with_store(db_url, delete):
            raise click.ClickException(f"no price for {model!r}")
        click.echo(f"removed the price of {model!r}")
        return
    if prompt_usd is None or completion_usd is None:
        raise click.UsageError("give --prompt-usd and --completion-usd (or --remove)")
    try:
        p = validate_price(model, prompt_usd, completion_usd)
    except InvalidRequest as exc:
        raise click.UsageError(str(exc)) from exc

    async def put(store: AccountStore) -> None:
        await (await _budgets(store)).put_price(model, p)

    _with_store(db_url, put)
    click.echo(f"price of {model!r}: ${p.prompt_usd_per_mtok:g} / ${p.completion_usd_per_mtok:g} "
               "per million prompt / completion tokens")


API_KEY_COMMANDS = [budget_group]
