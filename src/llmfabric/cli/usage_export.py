"""`llmfabric keys usage-export`: the usage ledger as CSV or JSON, by key, owner, model and
UTC day range (the same export as GET /v1/fabric/usage/export; direct database access)."""

from __future__ import annotations

import pathlib
import sys

import click

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.export import FORMATS, ExportFilter, render
from llmfabric.accounts.store import AccountStore
from llmfabric.cli.apikeys import _with_store, db_option


@click.command("usage-export")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv", show_default=True)
@click.option("--key-id", default=None, help="only this key")
@click.option("--owner", default=None, help="only this owner's keys")
@click.option("--model", default=None, help="only this model")
@click.option("--since", default=None, metavar="YYYY-MM-DD", help="first UTC day")
@click.option("--until", default=None, metavar="YYYY-MM-DD", help="last UTC day")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=None, help="write here [stdout]")
@db_option
def usage_export(fmt: str, key_id: str | None, owner: str | None, model: str | None,
                 since: str | None, until: str | None, output: pathlib.Path | None,
                 db_url: str | None) -> None:
    """Export token usage per key, model and day."""
    try:
        flt = ExportFilter(key_id, owner, model, since, until)
    except InvalidRequest as exc:
        raise click.BadParameter(str(exc)) from exc

    async def rows(store: AccountStore) -> bytes:
        got = await store.usage(key_id=flt.key_id, owner=flt.owner, since_day=flt.since,
                                until_day=flt.until, model=flt.model)
        return render(got, flt, fmt)[0]

    body = _with_store(db_url, rows)
    if output is None:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    else:
        output.write_bytes(body)
        click.echo(f"usage written to {output}", err=True)


API_KEY_COMMANDS: list[click.Command] = [usage_export]
