"""Injected time. Core logic takes a Clock so protocol tests can run on virtual time.

`now()` is monotonic seconds (for timeouts and intervals); `wall()` is Unix seconds (for values
that travel between nodes, such as record timestamps and GC retention). `utc_time` writes such
a wall time for people (messages, logs, the CLI).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: time.monotonic/time.time and asyncio.sleep."""

    # The C functions themselves, not methods around them: no Python frame per reading
    # (the ledger reads the wall clock once per request).
    now = staticmethod(time.monotonic)
    wall = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


async def with_timeout(clock: Clock, awaitable: Awaitable[T], seconds: float) -> T:
    """Await `awaitable` for at most `seconds` of the clock's time; raise TimeoutError after.

    asyncio.wait_for would use the loop's real time, which a FakeClock does not drive.
    """
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        done, _ = await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        # The task may have failed in the same instant: retrieve it so asyncio does not
        # report "exception was never retrieved".
        task.add_done_callback(_consume)
        raise
    finally:
        timer.cancel()
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_consume)
    raise TimeoutError(f"timed out after {seconds:.3f}s")


def _consume(task: asyncio.Future[T]) -> None:
    if not task.cancelled():
        task.exception()


def utc_time(unix_s: float) -> str:
    """`unix_s` as ISO-8601 UTC to the millisecond, as a revocation list file rounds its
    time (successive lists are issued at least 1 ms apart), e.g. 2026-12-02T16:17:05.123Z;
    a time past year 9999 or not finite (a signed list can carry one) as Unix seconds."""
    try:
        moment = _EPOCH + datetime.timedelta(milliseconds=round(unix_s * 1000))
    except (OverflowError, ValueError):
        return f"{unix_s:.15g} Unix seconds"
    return moment.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
