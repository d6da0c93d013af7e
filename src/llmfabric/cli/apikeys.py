"""`llmfabric keys create|list|revoke`: API keys in the local accounts database.

The `keys` group lives in cli/keys.py; it registers API_KEY_COMMANDS. These commands act as
the local operator (direct database access), so they may revoke any key.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import pathlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from llmfabric.accounts import AccountsError, AccountStore, ApiKey, default_db_url
from llmfabric.accounts.expiry import format_time, parse_expiry
from llmfabric.accounts.policy import MAX_RATE_LIMIT
from llmfabric.cli.untrusted import printable

T = TypeVar("T")
_LIMIT = click.IntRange(min=1, max=MAX_RATE_LIMIT)  # the limit columns are 32-bit integers

db_option = click.option(
    "--db",
    "db_url",
    default=None,
    metavar="PATH|URL",
    help="accounts database: a SQLite path, sqlite:///path or postgresql://... "
    "[default: $LLMFABRIC_DB or $LLMFABRIC_HOME/accounts.db, ~/.llmfabric/accounts.db]",
)


def _sqlite_file(url: str) -> pathlib.Path | None:
    """The file of a SQLite database URL or path (as accounts/db.open_backend reads it); None
    for PostgreSQL, an in-memory database or a scheme it refuses."""
    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    if not url or url in (":memory:", "sqlite://", "sqlite://:memory:") or "://" in url:
        return None
    return pathlib.Path(url).expanduser()


def _with_store(db_url: str | None, fn: Callable[[AccountStore], Awaitable[T]], *,
                existing: bool = False) -> T:
    """Run `fn` on the accounts database. `existing`: only read or change one that is
    there (a mistyped --db or the wrong $LLMFABRIC_HOME made an empty database, and `keys
    list` then said 'no keys')."""
    url = db_url or default_db_url()
    path = _sqlite_file(url)
    if existing and path is not None and not path.exists():
        raise click.ClickException(
            f"no accounts database at {path}: give --db with your ingress's database (it "
            "keeps accounts.db in its --home), or set $LLMFABRIC_HOME or $LLMFABRIC_DB")

    async def run() -> T:
        store = await AccountStore.open(url, background=False)
        try:
            return await fn(store)
        finally:
            await store.aclose()

    try:
        return asyncio.run(run())
    except AccountsError as exc:
        raise click.ClickException(str(exc)) from exc


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M")


@click.command("create")
@click.option("--name", required=True, help="a label for the key, e.g. the application")
@click.option("--owner", required=True, help="who the key belongs to (user or team)")
@click.option("--admin", is_flag=True, help="the key may manage every owner's keys and usage")
@click.option("--rpm", "requests_per_min", type=_LIMIT, default=None,
              help="requests per minute [default: unlimited]")
@click.option("--tpm", "tokens_per_min", type=_LIMIT, default=None,
              help="tokens per minute [default: unlimited]")
@click.option("--no-trace", is_flag=True, help="do not record this key's requests in traces")
@click.option("--expires", default=None, metavar="WHEN",
              help="refuse the key after WHEN: 90m, 12h, 30d, 2w from now, a UTC date "
              "2027-01-31 (its start, 00:00 UTC) or 2027-01-31T12:00:00Z [default: never]")
@click.option("--models", default=None, metavar="ID,ID,...",
              help="the only model ids the key may use (their aliases and LoRA adapters "
              "too); GET /v1/models shows it only these [default: every model]")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@db_option
def create(
    name: str, owner: str, admin: bool, requests_per_min: int | None,
    tokens_per_min: int | None, no_trace: bool, expires: str | None, models: str | None,
    as_json: bool, db_url: str | None,
) -> None:
    """Create an API key and print it (it is shown only this once)."""
    allowed = None if models is None else [m for m in models.split(",") if m.strip()]
    if allowed == []:  # (the API's words: "models must name ... (leave it unset ...)")
        raise click.BadParameter(f"{models!r} names no model id: leave --models out for a "
                                 "key that reaches every model", param_hint="--models")

    async def make(store: AccountStore) -> tuple[ApiKey, str]:
        expires_at = None if expires is None else parse_expiry(expires, store.now())
        if expires_at is not None and expires_at <= store.now():  # (said "expires_at is ...")
            raise click.BadParameter(
                f"{expires!r} is in the past ({format_time(expires_at)}): give a later date, "
                "or a duration from now such as 30d", param_hint="--expires")
        return await store.create_key(
            name, owner, admin=admin, requests_per_min=requests_per_min,
            tokens_per_min=tokens_per_min, record_trace=not no_trace, expires_at=expires_at,
            models=allowed)

    key, plaintext = _with_store(db_url, make)
    if as_json:
        click.echo(json.dumps({**key.to_json(), "key": plaintext}))
        return
    click.echo(f"created key {key.id} ({printable(key.name)}, owner {key.owner}"
               f"{', admin' if admin else ''})")
    if key.expires_at is not None:
        click.echo(f"expires {format_time(key.expires_at)}")
    if key.models is not None:
        click.echo(f"models: {', '.join(sorted(key.models))}")
    click.echo("store it now; it is not shown again:")
    click.echo(plaintext)


@click.command("list")
@click.option("--owner", default=None, help="only this owner's keys")
@click.option("--all", "show_all", is_flag=True, help="include revoked keys")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@db_option
def list_(owner: str | None, show_all: bool, as_json: bool, db_url: str | None) -> None:
    """List API keys (ids and metadata; secrets are never stored)."""
    keys = _with_store(db_url, lambda s: s.list_keys(owner=owner), existing=True)
    if not show_all:
        keys = [k for k in keys if k.active]
    if as_json:
        click.echo(json.dumps([k.to_json() for k in keys]))
        return
    if not keys:
        click.echo("no keys" + ("" if show_all else " (use --all to include revoked ones)"))
        return
    now = time.time()
    click.echo(f"{'ID':16}  {'NAME':20}  {'OWNER':16}  ADMIN  RPM     TPM       CREATED"
               "           REVOKED           EXPIRES             MODELS")
    for k in keys:
        # Any key names the keys it creates: escaped before it is cut (a cut escape
        # sequence would still open one).
        expires = _when(k.expires_at) + (" (past)" if k.expired(now) else "")
        click.echo(
            f"{k.id:16}  {printable(k.name)[:20]:20}  {k.owner[:16]:16}  "
            f"{'yes' if k.admin else 'no':5}  "
            f"{k.requests_per_min or '-'!s:6}  {k.tokens_per_min or '-'!s:8}  "
            f"{_when(k.created_at):16}  {_when(k.revoked_at):16}  {expires:18}  "
            f"{'all' if k.models is None else printable(','.join(sorted(k.models)))}"
        )


@click.command("revoke")
@click.argument("key_id")
@db_option
def revoke(key_id: str, db_url: str | None) -> None:
    """Revoke the key KEY_ID (running ingresses notice within seconds)."""
    key = _with_store(db_url, lambda s: s.revoke(key_id, by=None), existing=True)
    click.echo(f"revoked key {key.id} ({printable(key.name)}, owner {key.owner})")


API_KEY_COMMANDS: list[click.Command] = [create, list_, revoke]
