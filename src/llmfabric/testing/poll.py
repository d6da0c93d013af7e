"""One polling helper for tests that wait on real time (sockets, subprocesses).

Code on an injected clock needs none of this: advance a FakeClock (`run_until`). Real
sockets and processes can only be polled:

    await wait_until(lambda: b.connected(a.local_id), 5.0, "b dialled a")
    wait_until_sync(lambda: port_open(p), 10.0, "the engine's port", ignore=(OSError,))

Both return the seconds the wait took (tests that report detection times print it) and raise
AssertionError("not within Ns: WHAT") when the predicate stays false; exceptions of the
`ignore` types count as false (a server that is not up yet refuses connections).
`wait_for_value` is `wait_until_sync` for a predicate whose truthy result the test goes on
with (the nodes a fleet view lists once they are all there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _holds(predicate: Callable[[], object], ignore: tuple[type[BaseException], ...]) -> bool:
    try:
        return bool(predicate())
    except ignore:
        return False


async def wait_until(
    predicate: Callable[[], object], within: float = 5.0, what: str = "", *,
    interval: float = 0.01, ignore: tuple[type[BaseException], ...] = (),
) -> float:
    """Poll `predicate` every `interval` s on the running loop until it holds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not _holds(predicate, ignore):
        if loop.time() - start >= within:
            raise AssertionError(f"not within {within}s: {what or predicate}")
        await asyncio.sleep(interval)
    return loop.time() - start


def wait_until_sync(
    predicate: Callable[[], object], within: float = 5.0, what: str = "", *,
    interval: float = 0.05, ignore: tuple[type[BaseException], ...] = (),
) -> float:
    """`wait_until` for synchronous tests (blocks the thread between polls)."""
    start = time.monotonic()
    while not _holds(predicate, ignore):
        if time.monotonic() - start >= within:
            raise AssertionError(f"not within {within}s: {what or predicate}")
        time.sleep(interval)
    return time.monotonic() - start


def wait_for_value(
    predicate: Callable[[], T], within: float = 5.0, what: str = "", *,
    interval: float = 0.05, ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_until_sync` that returns the predicate's first truthy result."""
    last: list[T] = []

    def holds() -> T:
        last[:] = [predicate()]
        return last[0]

    wait_until_sync(holds, within, what, interval=interval, ignore=ignore)
    return last[0]
