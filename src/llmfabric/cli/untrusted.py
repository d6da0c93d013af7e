"""Text that others wrote (other members' records, key names, peers' and engines' error
texts, request paths) on the operator's terminal and in the node's log.

`printable()` writes control characters as escapes; `LogFormatter` passes every log line
through it; `configure_logging()` is the `logging.basicConfig` of every CLI process that logs.
No rich here: `llmfabric start` imports this and should not pay for rich.
"""

from __future__ import annotations

import logging
import traceback
from types import TracebackType

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | \
    tuple[None, None, None]


def printable(text: str) -> str:
    """`text` with its non-printable characters written as escapes (`\\x1b`, `\\n`,
    `\\u202e`): C0/C1 controls (ESC sequences that repaint the screen, set a hyperlink or
    write the clipboard; CR and newlines that forge lines), bidi overrides and other format
    characters. Plain names, non-ASCII letters included, come back unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _escape_inner(chunk: str) -> str:
    """`chunk` escaped, its leading and trailing newlines kept (the traceback's layout)."""
    body = chunk.strip("\n")
    if not body:
        return chunk
    start = chunk.index(body)
    return chunk[:start] + printable(body) + chunk[start + len(body):]


class LogFormatter(logging.Formatter):
    """Log calls interpolate peers' names, reasons and error texts (and engine output) with
    %s: a newline there would start a forged log line, an ESC sequence would drive the
    terminal of whoever runs `tail -f`. Escaping here covers every call, present and future."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_text
        record.exc_text = None  # (ours, not one another handler's formatter cached)
        try:
            return super().format(record)
        finally:
            record.exc_text = saved

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: _ExcInfo) -> str:
        if ei[1] is None:
            return super().formatException(ei)
        out = []
        for chunk in traceback.TracebackException(type(ei[1]), ei[1], ei[2]).format():
            # A frame's lines (local file names and source) keep their layout; the rest,
            # above all the exception's message (which may quote a peer), is escaped.
            if chunk.lstrip(" |").startswith(("File ", "[Previous line")):
                out.append(chunk)
            else:
                out.append(_escape_inner(chunk))
        return "".join(out).rstrip("\n")


def configure_logging(level: int, fmt: str) -> None:
    """`logging.basicConfig(level, format)` on stderr, through `LogFormatter`."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
