from __future__ import annotations

import asyncio
import itertools

import pytest

from llmfabric.engines.batcher import Batcher
from llmfabric.engines.timing import TableTiming
from llmfabric.testing.fake_clock import FakeClock

TIMING = TableTiming(prefill_base_s=0.1, prefill_per_token_s=0.0, step_base_s=0.01,
                     step_per_seq_s=0.005, step_per_ctx_token_s=0.0)


async def _collect(b: Batcher, clock: FakeClock, prompt: int, n: int) -> list[float]:
    return [clock.now() async for _ in b.generate(prompt, n)]


async def test_single_stream_token_times() -> None:
    clock = FakeClock()
    b = Batcher(TIMING, clock)
    task = asyncio.create_task(_collect(b, clock, 10, 4))
    await clock.run_until(task.done, within=5.0, step=0.001)
    times = task.result()
    assert times[0] == pytest.approx(0.1)  # prefill
    assert [round(t2 - t1, 6) for t1, t2 in itertools.pairwise(times)] == [0.01] * 3


async def test_concurrent_streams_share_decode_steps() -> None:
    clock = FakeClock()
    b = Batcher(TIMING, clock)
    tasks = [asyncio.create_task(_collect(b, clock, 10, 20)) for _ in range(4)]
    await clock.run_until(lambda: all(t.done() for t in tasks), within=10.0, step=0.001)
    assert all(len(t.result()) == 20 for t in tasks)
    # Batched: far fewer steps than 4 x 19 would need one at a time.
    assert b.steps < 4 * 19
    # Prefills queue: the last stream's first token comes after four prefills.
    assert max(t.result()[0] for t in tasks) == pytest.approx(0.4, abs=1e-3)
    # A step of a batch of 4 costs more than a step of one (continuous batching cost).
    last = tasks[-1].result()
    assert last[-1] - last[-2] > 0.01


async def test_speed_and_slow_scale_time() -> None:
    clock = FakeClock()
    b = Batcher(TIMING, clock, speed=10.0)
    b.slow = 2.0
    task = asyncio.create_task(_collect(b, clock, 1, 2))
    await clock.run_until(task.done, within=5.0, step=0.001)
    first, second = task.result()
    assert first == pytest.approx(0.02)
    assert second - first == pytest.approx(0.002)


async def test_pause_freezes_tokens() -> None:
    clock = FakeClock()
    b = Batcher(TIMING, clock)
    b.pause()
    task = asyncio.create_task(_collect(b, clock, 1, 2))
    await clock.advance(10.0)
    assert not task.done()
    b.resume()
    await clock.run_until(task.done, within=1.0, step=0.001)
    assert len(task.result()) == 2
    await b.aclose()


def test_bad_speed_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        Batcher(TIMING, FakeClock(), speed=0)
