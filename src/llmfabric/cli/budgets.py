"""`llmfabric keys budget set|list|rm`: budgets in the local accounts database.

The same budgets as `PUT /v1/fabric/budgets/{scope}/{name}` (docs/accounts.md), written
straight to the database as the local operator: the way to set them for a standalone
`llmfabric ingress`, which serves no admin routes. Running ingresses on that database pick a
change up within their budget sync (2 s).
"""

from __future__ import annotations

import json
import time

import click

from llmfabric.accounts import AccountStore
from llmfabric.accounts.budgets import SCOPES, BudgetBook, BudgetStore, validate_budget
from llmfabric.accounts.errors import InvalidRequest
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
              show_default=True)
@db_option
def set_budget(scope: str, name: str, tokens: int | None, usd: float | None, period: str,
               db_url: str | None) -> None:
    """Set the budget of SCOPE NAME (a key id, an owner or a team); replaces any other."""
    try:
        budget = validate_budget(scope, name, tokens, period, usd=usd)
    except InvalidRequest as exc:
        raise click.UsageError(str(exc)) from exc

    async def put(store: AccountStore) -> None:
        await (await _budgets(store)).put(budget)

    _with_store(db_url, put)
    click.echo(f"budget of {scope} {name!r}: {budget.show(budget.limit)} per {period}")


@budget_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@db_option
def list_budgets(as_json: bool, db_url: str | None) -> None:
    """Budgets with what the ledger holds as spent this period (every ingress that writes
    to this database; requests in flight and usage not flushed yet are not in it)."""

    async def status(store: AccountStore) -> list[dict[str, object]]:
        return (await _budgets(store)).book.status()

    rows = _with_store(db_url, status)
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no budgets")
    for r in rows:
        limit = r.get("tokens", r.get("usd"))
        unit = "tokens" if "tokens" in r else "USD"
        spent = r["spent"] if unit == "tokens" else int(str(r["spent"])) / 1e6
        click.echo(f"{r['scope']:<6} {r['name']:<24} {limit} {unit} per {r['period']}, "
                   f"spent {spent} in {r['period_id']}")


@budget_group.command("rm")
@click.argument("scope", type=click.Choice(SCOPES))
@click.argument("name")
@db_option
def remove_budget(scope: str, name: str, db_url: str | None) -> None:
    """Remove the budget of SCOPE NAME."""

    async def delete(store: AccountStore) -> bool:
        return await (await _budgets(store)).delete(scope, name)

    if not _with_store(db_url, delete):
        raise click.ClickException(f"no budget for {scope} {name!r}")
    click.echo(f"removed the budget of {scope} {name!r}")


API_KEY_COMMANDS = [budget_group]
