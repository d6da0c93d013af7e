import asyncio

import pytest

from llmfabric.clock import with_timeout
from llmfabric.testing.fake_clock import FakeClock


async def test_timers_fire_in_deadline_order_on_virtual_time() -> None:
    clock = FakeClock()
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        fired.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper(n, d)) for n, d in [("b", 2.0), ("a", 1.0), ("c", 3.0)]]
    await clock.advance(2.5)
    assert fired == [("a", 1.0), ("b", 2.0)]
    await clock.advance(1.0)
    assert fired[-1] == ("c", 3.0)
    await asyncio.gather(*tasks)


async def test_with_timeout_uses_the_injected_clock() -> None:
    clock = FakeClock()
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiter = asyncio.create_task(with_timeout(clock, never, 5.0))
    await clock.advance(4.9)
    assert not waiter.done()
    await clock.advance(0.2)
    with pytest.raises(TimeoutError):
        await waiter
    assert never.cancelled()


async def test_run_until_stops_when_predicate_holds() -> None:
    clock = FakeClock()
    box: list[int] = []

    async def later() -> None:
        await clock.sleep(0.5)
        box.append(1)

    task = asyncio.create_task(later())
    assert await clock.run_until(lambda: bool(box), within=2.0)
    assert 0.5 <= clock.now() < 0.6
    await task


async def test_with_timeout_retrieves_the_abandoned_tasks_exception() -> None:
    import gc

    clock = FakeClock()
    reports: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: reports.append(ctx))

    async def fails_when_cancelled() -> None:
        try:
            await clock.sleep(10.0)
        except asyncio.CancelledError:
            raise ValueError("cleanup failed") from None

    waiter = asyncio.create_task(with_timeout(clock, fails_when_cancelled(), 1.0))
    await clock.advance(1.5)
    with pytest.raises(TimeoutError):
        await waiter
    del waiter  # its TimeoutError's traceback would keep the abandoned task alive
    await clock.settle()
    gc.collect()
    await clock.settle()
    loop.set_exception_handler(None)
    assert not [r for r in reports if "never retrieved" in str(r.get("message"))]


async def test_resolution_fires_close_timers_together_in_deadline_order() -> None:
    clock = FakeClock(resolution=0.01)
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        fired.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper(n, d))
             for n, d in [("b", 1.005), ("a", 1.0), ("c", 1.02)]]
    await clock.advance(2.0)
    # a and b are within 10 ms of each other: b fires with a, at a's time; c later on its own
    assert fired == [("a", 1.0), ("b", 1.0), ("c", 1.02)]
    await asyncio.gather(*tasks)
    with pytest.raises(ValueError, match="resolution"):
        FakeClock(resolution=-1)
