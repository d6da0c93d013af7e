"""Data parallelism in the simulated engine: dp replicas, each with its own batch."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.engines.batcher import Batcher
from llmfabric.engines.dp import DataParallel
from llmfabric.engines.sim_server import SimEngine, SimEngineConfig
from llmfabric.engines.timing import TableTiming
from llmfabric.testing.fake_clock import FakeClock

TIMING = TableTiming(prefill_base_s=0.1, prefill_per_token_s=0.0, step_base_s=0.01,
                     step_per_seq_s=0.005, step_per_ctx_token_s=0.0)


async def _finish_times(engine: Batcher | DataParallel, clock: FakeClock, n: int) -> list[float]:
    async def one() -> float:
        async for _ in engine.generate(10, 20):
            pass
        return clock.now()

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    await clock.run_until(lambda: all(t.done() for t in tasks), within=30.0, step=0.001)
    return [t.result() for t in tasks]


async def test_two_replicas_serve_twice_the_load_in_the_time_of_one() -> None:
    """8 requests on dp=2 finish as 4 requests on one replica do: each replica has its own
    prefill queue and decode batch (capacity scales with dp, as the plan assumes)."""
    clock = FakeClock()
    single = await _finish_times(Batcher(TIMING, clock), clock, 4)
    clock2 = FakeClock()
    dp = DataParallel([Batcher(TIMING, clock2) for _ in range(2)])
    double = await _finish_times(dp, clock2, 8)
    assert max(double) == pytest.approx(max(single), abs=1e-3)
    assert [b.steps > 0 for b in dp.replicas] == [True, True]
    clock3 = FakeClock()
    crowded = await _finish_times(Batcher(TIMING, clock3), clock3, 8)
    assert max(crowded) > max(double) * 1.3  # one replica with 8: slower


async def test_controls_reach_every_replica() -> None:
    clock = FakeClock()
    dp = DataParallel([Batcher(TIMING, clock) for _ in range(3)])
    dp.slow = 2.0
    assert [b.slow for b in dp.replicas] == [2.0] * 3 and dp.slow == 2.0
    dp.pause()

    async def first_token() -> float:
        async for _ in dp.generate(10, 1):
            pass
        return clock.now()

    task = asyncio.create_task(first_token())
    await clock.advance(1.0)
    assert not task.done()
    dp.resume()
    await clock.run_until(task.done, within=5.0, step=0.001)
    assert task.result() == pytest.approx(1.0 + 2 * 0.1, abs=1e-3)  # slowed prefill
    await dp.aclose()


def test_engine_config_dp_builds_replicas_per_model() -> None:
    eng = SimEngine(SimEngineConfig(models=("a", "b"), dp=4))
    for m in ("a", "b"):
        b = eng.batchers[m]
        assert isinstance(b, DataParallel) and len(b.replicas) == 4
    assert isinstance(SimEngine(SimEngineConfig(models=("a",))).batchers["a"], Batcher)
