"""`llmfabric.testing.work.python_lines`: the clock-free cost measure of the hostile-input tests."""

from __future__ import annotations

import gc
import sys

import pytest

from llmfabric.testing.work import TooMuchWork, python_lines

pytestmark = pytest.mark.unit


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_lines_grow_with_the_python_work_and_not_with_c_work() -> None:
    (r10, n10), (r20, n20) = python_lines(_loop, 10), python_lines(_loop, 20)
    assert (r10, r20) == (45, 190)
    assert n20 - n10 == 2 * 10  # two lines (the for and its body) per iteration
    _, in_c = python_lines(sum, range(10**6))  # a builtin runs no Python line
    assert in_c == 0


def test_past_the_limit_the_call_stops_and_tracing_is_restored() -> None:
    before = sys.gettrace()
    with pytest.raises(TooMuchWork, match="_loop ran more than 100 lines"):
        python_lines(_loop, 10**9, limit=100)  # (would run for minutes untraced)
    assert sys.gettrace() is before
    _, n = python_lines(_loop, 3)
    assert 0 < n < 20 and sys.gettrace() is before


def _allocate(n: int) -> int:
    kept = [[] for _ in range(n)]  # (containers: they trigger collections)
    return len(kept)


def test_gc_callbacks_are_not_counted_as_the_call_s_lines() -> None:
    """hypothesis installs a gc callback for the whole session: with collections on, its
    Python ran at allocation points inside the call and was counted (a test that passed
    alone failed in the suite)."""
    _, alone = python_lines(_allocate, 200_000)
    calls: list[object] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        calls.append(phase)
        calls.append(info.get("generation"))

    gc.callbacks.append(callback)
    try:
        _, with_callback = python_lines(_allocate, 200_000)
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert calls  # (the callback is live: a collection outside the count ran it)
    assert with_callback == alone
    assert gc.isenabled()
