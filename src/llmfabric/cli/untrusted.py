"""Text that others wrote (other members' records, key names, peers' and engines' error
texts, request paths) on the operator's terminal and in the node's log.

`printable()` (llmfabric/untrusted.py) writes control characters as escapes; `LogFormatter`
passes every log line through it and clips its message; `configure_logging()` is the
`logging.basicConfig` of every CLI process that logs.
No rich here: `llmfabric start` imports this and should not pay for rich.
"""

from __future__ import annotations

import logging
from types import TracebackType

from llmfabric.untrusted import clip, format_exception, printable

__all__ = ["LogFormatter", "configure_logging", "printable"]

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | \
    tuple[None, None, None]


class LogFormatter(logging.Formatter):
    """Log calls interpolate peers' names, reasons and error texts (and engine output) with
    %s: a newline there would start a forged log line, an ESC sequence would drive the
    terminal of whoever runs `tail -f`. Escaping here covers every call, present and future,
    other libraries' loggers (aiohttp, asyncio) included. A message is clipped to
    `MESSAGE_CAP` characters ("... [N more characters]"); a traceback's exception messages
    each are, its frames (our own code) are not."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_text
        record.exc_text = None  # (ours, not one another handler's formatter cached)
        try:
            return super().format(record)
        finally:
            record.exc_text = saved

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = clip(printable(message))
        try:
            return printable(super().formatMessage(record))
        finally:
            record.message = message

    def formatException(self, ei: _ExcInfo) -> str:
        if ei[1] is None:
            return super().formatException(ei)
        return format_exception(ei[1])


def configure_logging(level: int, fmt: str) -> None:
    """`logging.basicConfig(level, format)` on stderr, through `LogFormatter`."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
