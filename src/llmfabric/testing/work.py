"""Work counted without a clock: the Python lines a call runs, for tests that bound what a
hostile input costs. A timing assertion moves with the machine's load; a line count is the
same on every run, and a regression that walks a huge body in Python shows as millions of
lines (stopped at `limit`, so it fails at once instead of tracing for minutes).

    doc, lines = python_lines(load_object, body)   # every Python frame's "line" events
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
DEFAULT_LIMIT = 10_000_000


class TooMuchWork(AssertionError):
    """The call ran more Python lines than the limit allowed."""


def python_lines(f: Callable[..., T], *args: Any, limit: int = DEFAULT_LIMIT) -> tuple[T, int]:
    """(f(*args), the lines of Python it ran, in every frame it entered); raises TooMuchWork
    past `limit` lines. C code (orjson, builtins) runs no lines: its cost is not counted. The
    garbage collector is off during the call."""
    count = 0

    def on_line(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:  # (an error in a trace function also switches tracing off)
                raise TooMuchWork(f"{getattr(f, '__name__', f)} ran more than {limit:,} "
                                  "lines of Python")
        return on_line  # (for a "call" too: it then traces that frame's lines)

    # No collection while counting: gc callbacks (hypothesis installs one for the session)
    # would run their Python at whatever allocation triggers a collection, counted as f's.
    gc_was_on = gc.isenabled()
    gc.disable()
    before = sys.gettrace()
    sys.settrace(on_line)
    try:
        result = f(*args)
    finally:
        sys.settrace(before)
        if gc_was_on:
            gc.enable()
    return result, count
