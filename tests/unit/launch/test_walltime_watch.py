"""The node drains `lead` seconds before its allocation ends, on the fake clock, and follows
an extended time limit."""

from __future__ import annotations

import asyncio

from llmfabric.launch.allocation import WalltimeWatch
from llmfabric.testing.fake_clock import FakeClock


async def test_drains_lead_seconds_before_the_end() -> None:
    clock = FakeClock()
    drained: list[float] = []

    async def drain() -> None:
        drained.append(clock.wall())

    end = clock.wall() + 600
    watch = WalltimeWatch(clock, end, 120, drain=drain, republish=lambda _: None)
    task = asyncio.create_task(watch.run())
    await clock.advance(479)
    assert drained == []
    await clock.advance(2)
    assert drained == [end - 120]
    await task


async def test_an_extended_limit_is_republished_and_moves_the_drain() -> None:
    clock = FakeClock()
    drained: list[float] = []
    published: list[float] = []
    end0 = clock.wall() + 300
    ends = iter([end0, end0 + 600])

    async def drain() -> None:
        drained.append(clock.wall())

    watch = WalltimeWatch(clock, end0, 60, drain=drain, republish=published.append,
                          refresh=lambda: next(ends, end0 + 600), refresh_s=60)
    task = asyncio.create_task(watch.run())
    for _ in range(5):  # refresh at 60 s (same end), then 120 s (extended)
        await clock.advance(30)
        await asyncio.sleep(0.01)  # the refresh runs in a worker thread
        await clock.settle()
    assert published == [end0 + 600] and drained == []
    for _ in range(30):
        await clock.advance(30)
        await asyncio.sleep(0.01)
        await clock.settle()
    await task
    assert drained and drained[0] >= end0 + 600 - 60
