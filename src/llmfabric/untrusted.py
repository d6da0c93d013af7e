"""Text that others wrote (members' model names and labels, peers' and engines' error texts,
request paths, key names) on its way to a terminal, a log or a file the operator reads.

- `printable(text)`: control and format characters written as escapes (`\\x1b`, `\\n`,
  `\\u202e`); printable text, non-ASCII letters included, unchanged.
- `clip(text)`: at most `MESSAGE_CAP` characters, then "... [N more characters]".
- `markdown_text(text)`: printable, and inert in Markdown (a table cell stays one cell, no
  HTML, links or code spans).
- `format_exception(exc)`: a traceback whose exception messages and notes are escaped and
  clipped (exception groups included) while the frames keep their lines.
- `get_logger(name)`: `logging.getLogger(name)` with `EscapingFilter`, which escapes and clips
  a record's message and arguments and sets its traceback text, whatever handler and
  formatter the process configured. Every llmfabric module logs through one.
- `log_due(n)`: whether the n-th occurrence of a counted failure is logged (the 1st, 2nd,
  4th, 8th...): a failure others can repeat at will (a peer's message, a client's request)
  is seen in the log without flooding it.

Rank 0 (no llmfabric imports): every layer may use it.
"""

from __future__ import annotations

import logging
import numbers
import traceback
from collections.abc import Iterator, Mapping

MESSAGE_CAP = 8 * 1024  # characters of one log message, exception message or argument


def printable(text: str) -> str:
    """`text` with its non-printable characters written as escapes (`\\x1b`, `\\n`,
    `\\u202e`): C0/C1 controls (ESC sequences that repaint the screen, set a hyperlink or
    write the clipboard; CR and newlines that forge lines), bidi overrides and other format
    characters. Plain names, non-ASCII letters included, come back unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(text: str, limit: int = MESSAGE_CAP) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters]"


_MARKDOWN = {c: "\\" + c for c in "\\`*[]<>|&~$"}


def markdown_text(text: str) -> str:
    """`text` for a Markdown file (a table cell included): escaped as `printable()`, then
    backslash before each of \\ ` * [ ] < > | & ~ $ (a `|` would end the cell, `<` open
    HTML, `[` a link, a backtick a code span, `&` an entity, `$` math in some renderers)."""
    return "".join(_MARKDOWN.get(c, c) for c in printable(text))


def _escape_inner(chunk: str) -> str:
    """`chunk` escaped, its leading and trailing newlines kept (the traceback's layout)."""
    body = chunk.strip("\n")
    if not body:
        return chunk
    start = chunk.index(body)
    return chunk[:start] + clip(printable(body)) + chunk[start + len(body):]


def _all(te: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """`te`, its causes and contexts, and the members of exception groups, each once."""
    seen: set[int] = set()
    todo = [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        yield t
        todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
        todo.extend(getattr(t, "exceptions", None) or ())


def format_exception(exc: BaseException) -> str:
    """The traceback `logging` would print for `exc`, without its trailing newline: frames
    (our files and source lines) as they are; exception messages and notes, which may quote
    a peer, escaped and clipped. Inside an exception group a message's newline would
    otherwise stay a line break behind the group's "  | " margin, so the messages are
    escaped before the traceback is laid out."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    for t in _all(te):
        text = getattr(t, "_str", None)  # (str(exc), as TracebackException keeps it)
        if isinstance(text, str):
            setattr(t, "_str", clip(printable(text)))  # noqa: B010 (a private attribute)
        notes = getattr(t, "__notes__", None)
        if isinstance(notes, list | tuple):
            t.__notes__ = [clip(printable(str(n))) for n in notes]
    out = []
    for chunk in te.format():
        # A frame's lines (local file names and source) keep their layout; the rest is
        # escaped (again: escaping printable text changes nothing).
        if chunk.lstrip(" |").startswith(("File ", "[Previous line")):
            out.append(chunk)
        else:
            out.append(_escape_inner(chunk))
    return "".join(out).rstrip("\n")


class _Text(str):
    """A log argument as `%s` prints it, escaped and clipped; `%r` escapes its repr."""

    _obj: object

    def __new__(cls, obj: object, text: str) -> _Text:
        self = super().__new__(cls, clip(printable(text)))
        self._obj = obj
        return self

    def __repr__(self) -> str:
        return clip(printable(repr(self._obj)))


def _arg(value: object) -> object:
    if isinstance(value, numbers.Number | _Text):  # (%d and %f keep their numbers)
        return value
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        return value  # (logging reports a broken __str__ as it always did)
    return _Text(value, text)


class EscapingFilter(logging.Filter):
    """Log calls interpolate peers' names, reasons and error texts (and engine output) with
    %s: a newline there would start a forged log line, an ESC sequence would drive the
    terminal of whoever runs `tail -f`, and an error text may be megabytes. This filter, on
    every llmfabric logger (`get_logger`), escapes and clips a record's message and each
    argument that is not a number, and sets its traceback text (`exc_text`) to
    `format_exception()`'s, so a process that configures logging itself (its own handlers
    and formatters) gets them escaped too. Honest records read as before; the message
    template stays the template."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else str(record.msg)
        if len(msg) > MESSAGE_CAP and record.args:
            try:  # (a clipped template could cut a %s in two)
                msg, record.args = record.getMessage(), None
            except Exception:  # (bad arguments: logging's handleError reports them)
                return True
        record.msg = clip(printable(msg))
        args = record.args
        if isinstance(args, Mapping):
            record.args = {k: _arg(v) for k, v in args.items()}
        elif args:
            record.args = tuple(_arg(a) for a in args)
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = format_exception(record.exc_info[1])
        return True


_FILTER = EscapingFilter()


def get_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` with `EscapingFilter` (a logger's filters see only the
    records logged on it, not its children's: each module's logger gets it)."""
    logger = logging.getLogger(name)
    logger.addFilter(_FILTER)
    return logger



def log_due(n: int) -> bool:
    """True for the 1st, 2nd, 4th, 8th... occurrence (`n` counts them, from 1): a failure
    that a peer or a client can trigger at will is logged, but 30 times per billion, not a
    billion times (the count itself goes to a metric)."""
    return n > 0 and n & (n - 1) == 0
