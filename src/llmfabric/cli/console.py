"""`table_console()`: the rich console the CLI prints its tables on; `printable()`: a string
from the network made safe to echo to a terminal.

On a terminal rich fits a table to the window. Piped (`llmfabric status | grep SERVING`, a
log file) it would assume 80 columns and cut cells to "SERV…"; there the tables get
`PIPED_WIDTH` columns instead, unless $COLUMNS says otherwise.
"""

from __future__ import annotations

import os
from typing import IO

from rich.console import Console

PIPED_WIDTH = 200


def table_console(stderr: bool = False, file: IO[str] | None = None) -> Console:
    console = Console(stderr=stderr, file=file)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, file=file, width=PIPED_WIDTH)
    return console


def printable(text: str) -> str:
    """`text` with its control characters written as escapes (`\\x1b`): strings from other
    nodes' records (model ids, labels) may carry terminal escape sequences that would repaint
    the operator's screen (a fake error line, a hidden command)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
