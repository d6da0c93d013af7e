"""A controller plans once its replica knows somebody: `settle` seconds at least, longer
while nobody else is known (a loaded machine's first exchange with a seed may be late), and
never forever (virtual time)."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.cli.controller_node import MORE_SETTLE_S, settle_replica
from llmfabric.testing.fake_clock import FakeClock


async def _run(
    clock: FakeClock,
    knows: list[bool],
    stop: asyncio.Event,
    until: float,
    flip_at: float | None = None,
) -> float | None:
    task = asyncio.create_task(settle_replica(clock, 3.0, lambda: knows[0], stop))
    while clock.now() < until and not task.done():
        await clock.advance(0.1)
        if flip_at is not None and clock.now() >= flip_at:
            knows[0] = True
    await clock.settle()
    return task.result() if task.done() else None


async def test_members_known_after_settle_means_no_extra_wait() -> None:
    clock = FakeClock()
    assert await _run(clock, [True], asyncio.Event(), until=60) == 3.0


async def test_an_empty_replica_waits_until_somebody_is_known() -> None:
    clock = FakeClock()
    waited = await _run(clock, [False], asyncio.Event(), until=60, flip_at=7.0)
    assert waited is not None and 7.0 <= waited <= 7.5


async def test_alone_it_gives_up_after_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    waited = await _run(clock, [False], asyncio.Event(), until=3.0 + MORE_SETTLE_S + 5)
    assert waited is not None and 3.0 + MORE_SETTLE_S <= waited <= 3.0 + MORE_SETTLE_S + 0.5
    # (it gave up in silence; with an ingress's --home it had dialled "itself")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "knows no other member after 33 s" in warning and "own --home" in warning


async def test_no_warning_once_somebody_is_known(caplog: pytest.LogCaptureFixture) -> None:
    await _run(FakeClock(), [False], asyncio.Event(), until=60, flip_at=7.0)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


async def test_a_stop_ends_the_wait() -> None:
    clock = FakeClock()
    stop = asyncio.Event()
    task = asyncio.create_task(settle_replica(clock, 3.0, lambda: False, stop))
    await clock.advance(5.0)
    assert not task.done()
    stop.set()
    await clock.advance(0.5)
    await clock.settle()
    assert task.done() and task.result() <= 5.5


async def test_settle_zero_does_not_wait() -> None:
    clock = FakeClock()
    task = asyncio.create_task(settle_replica(clock, 0.0, lambda: False, asyncio.Event()))
    await clock.advance(0.0)
    await clock.settle()
    assert task.done() and task.result() == 0.0
