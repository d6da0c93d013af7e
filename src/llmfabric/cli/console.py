"""`table_console()`: the rich console the CLI prints its tables on; `cell()`: a table cell
or line of text that others wrote (plain text, controls escaped: cli/untrusted.py).

On a terminal rich fits a table to the window. Piped (`llmfabric status | grep SERVING`, a
log file) it would assume 80 columns and cut cells to "SERV…"; there the tables get
`PIPED_WIDTH` columns instead, unless $COLUMNS says otherwise.
"""

from __future__ import annotations

import os
from typing import IO

from rich.console import Console
from rich.text import Text

from llmfabric.cli.untrusted import printable

PIPED_WIDTH = 200


def table_console(stderr: bool = False, file: IO[str] | None = None) -> Console:
    console = Console(stderr=stderr, file=file)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, file=file, width=PIPED_WIDTH)
    return console


def cell(text: str, style: str = "") -> Text:
    """`text` as rich prints it verbatim: a plain str cell is read as markup ("[/]" raises,
    "[link=...]" makes a hyperlink), and rich passes ESC sequences through to the terminal."""
    return Text(printable(text), style=style)
