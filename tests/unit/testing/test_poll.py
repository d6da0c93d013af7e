"""The polling helper: returns once the predicate holds, fails loudly when it never does."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.testing.poll import wait_for_value, wait_until, wait_until_sync


async def test_wait_until_returns_when_the_predicate_holds() -> None:
    flag: list[int] = []
    asyncio.get_running_loop().call_later(0.03, flag.append, 1)
    took = await wait_until(lambda: flag, 2.0, "the flag")
    assert flag == [1]
    assert 0.0 < took < 2.0  # the seconds it waited (tests report detection times with it)


async def test_wait_until_names_what_never_happened() -> None:
    with pytest.raises(AssertionError, match=r"not within 0.05s: the door opened"):
        await wait_until(lambda: False, 0.05, "the door opened")


async def test_ignored_errors_count_as_not_yet() -> None:
    calls: list[int] = []

    def flaky() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError
        return True

    await wait_until(flaky, 2.0, ignore=(OSError,))
    assert len(calls) == 3
    with pytest.raises(ZeroDivisionError):  # anything not ignored propagates
        await wait_until(lambda: 1 / 0, 1.0)


def test_wait_until_sync() -> None:
    calls: list[int] = []
    took = wait_until_sync(lambda: calls.append(1) or len(calls) >= 2, 2.0, interval=0.001)
    assert len(calls) == 2 and 0.0 < took < 2.0
    with pytest.raises(AssertionError, match="not within"):
        wait_until_sync(lambda: False, 0.01, "never", interval=0.001)


def test_wait_for_value_returns_the_first_truthy_result() -> None:
    results = iter([None, [], OSError, {"nodes": 2}, {"nodes": 3}])

    def next_view() -> object:
        got = next(results)
        if got is OSError:
            raise ConnectionRefusedError
        return got

    view = wait_for_value(next_view, 2.0, interval=0.001, ignore=(OSError,))
    assert view == {"nodes": 2}
    with pytest.raises(AssertionError, match=r"not within 0\.01s: a view"):
        wait_for_value(lambda: None, 0.01, "a view", interval=0.001)
