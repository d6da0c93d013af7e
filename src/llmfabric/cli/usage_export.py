"""`llmfabric keys usage-export`: the usage ledger as CSV or JSON, by key, owner, model and
UTC day range (the same export as GET /v1/fabric/usage/export; direct database access).

Model names come from clients: written to a file or a pipe the export is byte for byte, but
on a terminal its control and format characters are escaped (CSV as `printable()` writes
them, JSON as `\\uXXXX`, still valid JSON), so an ESC sequence in a model name does not reach
the terminal.
"""

from __future__ import annotations

import csv
import io
import pathlib
import sys
from typing import BinaryIO

import click

from llmfabric.accounts.errors import InvalidRequest
from llmfabric.accounts.export import FORMATS, ExportFilter, is_utc_day, stream
from llmfabric.accounts.store import AccountStore
from llmfabric.cli.apikeys import _with_store, db_option
from llmfabric.untrusted import printable


def _is_terminal() -> bool:
    return sys.stdout.isatty()


def _json_escape(c: str) -> str:
    if c.isprintable():
        return c
    code = ord(c)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def for_terminal(body: bytes, fmt: str) -> bytes:
    """`body` as a terminal may show it: controls, bidi and other format characters in its
    strings escaped; a CSV cell by cell as `printable()` writes them (rows stay rows), JSON
    as `\\uXXXX` (the JSON says the same; outside strings it has none)."""
    text = body.decode("utf-8", errors="replace")
    if fmt != "csv":
        return "".join(_json_escape(c) for c in text).encode()
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for row in csv.reader(io.StringIO(text, newline="")):
        w.writerow([printable(c) for c in row])
    return out.getvalue().encode()


@click.command("usage-export")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv", show_default=True,
              help="csv: a row per day, key and model; json: the same rows and their totals")
@click.option("--key-id", default=None, help="only this key")
@click.option("--owner", default=None, help="only this owner's keys")
@click.option("--model", default=None, help="only this model")
@click.option("--since", default=None, metavar="YYYY-MM-DD", help="first UTC day")
@click.option("--until", default=None, metavar="YYYY-MM-DD", help="last UTC day")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              default=None, help="write here [stdout; on a terminal control characters are "
              "escaped, piped it is byte for byte]")
@db_option
def usage_export(fmt: str, key_id: str | None, owner: str | None, model: str | None,
                 since: str | None, until: str | None, output: pathlib.Path | None,
                 db_url: str | None) -> None:
    """Export token usage per key, model and day.

    Model names are the clients' text: on a terminal their control characters are shown
    escaped (\\x1b in CSV, \\u001b in JSON); to a file (-o) or a pipe the export is
    written byte for byte."""
    # (ExportFilter's words are the API's: "since must be a UTC day", "until is before since")
    for flag, day in (("--since", since), ("--until", until)):
        if day is not None and not is_utc_day(day):
            raise click.BadParameter(f"{day!r} is not a UTC day: give YYYY-MM-DD, e.g. "
                                     "2026-01-31", param_hint=flag)
    if since and until and until < since:
        raise click.BadParameter(f"{until} is before --since {since}", param_hint="--until")
    try:
        flt = ExportFilter(key_id, owner, model, since, until)
    except InvalidRequest as exc:
        raise click.BadParameter(str(exc)) from exc

    terminal = output is None and _is_terminal()

    async def export(store: AccountStore) -> None:
        # A batch of rows at a time (accounts.export `stream`): memory stays at one batch
        # however large the ledger. Each piece is whole rows (CSV) or whole JSON values, so
        # escaping for a terminal piece by piece is the same as escaping the whole. The
        # file is opened at the first piece, once the database answered.
        out: BinaryIO | None = None
        try:
            async for piece in stream(store.usage_pages, store.usage_totals, flt, fmt):
                if out is None:
                    out = sys.stdout.buffer if output is None else output.open("wb")
                out.write(for_terminal(piece, fmt) if terminal else piece)
        finally:
            if out is not None and output is not None:
                out.close()

    _with_store(db_url, export, existing=True)
    if output is None:
        sys.stdout.flush()
    else:
        click.echo(f"usage written to {output}", err=True)

API_KEY_COMMANDS: list[click.Command] = [usage_export]
