"""The simulated engine's Flying Serving: DP batchers bind into a TP batcher under the shared
switching policies; requests bound to a group run on its faster TP timing."""

from __future__ import annotations

import asyncio

import pytest

from llmfabric.engines.batcher import Batcher
from llmfabric.engines.flying_dp import FlyingDataParallel
from llmfabric.engines.timing import TableTiming
from llmfabric.sim.switching import make_policy
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit


def _timing(width: int) -> TableTiming:  # a W-wide group steps W times faster
    return TableTiming(prefill_base_s=0.1 / width, prefill_per_token_s=0.0,
                       step_base_s=0.01 / width, step_per_seq_s=0.0, step_per_ctx_token_s=0.0)


def _engine(clock: FakeClock, policy: str | None = None, **opts: object
            ) -> FlyingDataParallel:
    pol = make_policy(policy, **opts) if policy else None
    return FlyingDataParallel(lambda w: Batcher(_timing(w), clock), 2, (1, 2), pol, clock)


async def _latency(fdp: FlyingDataParallel, clock: FakeClock) -> float:
    start = clock.now()

    async def one() -> float:
        async for _ in fdp.generate(10, 11):
            pass
        return clock.now() - start

    task = asyncio.create_task(one())
    await clock.run_until(task.done, within=10.0, step=0.001)
    return task.result()


async def test_operator_switch_routes_to_the_tp_batcher() -> None:
    clock = FakeClock()
    fdp = _engine(clock)
    dp_latency = await _latency(fdp, clock)  # 0.1 prefill + 10 x 0.01 decode
    assert dp_latency == pytest.approx(0.2, abs=2e-3)
    fdp.switch(2)
    assert fdp.status()["width"] == 2 and fdp.status()["groups"] == [[0, 1]]
    tp_latency = await _latency(fdp, clock)
    assert tp_latency == pytest.approx(0.1, abs=2e-3)
    fdp.switch(1)
    st = fdp.status()
    assert st["width"] == 1 and st["switches"] == 2
    with pytest.raises(ValueError):
        fdp.switch(4)
    await fdp.aclose()


async def test_the_policy_binds_on_its_own() -> None:
    clock = FakeClock()
    # load_threshold: nothing waits on engine 0 -> bind all engines at the first tick
    fdp = _engine(clock, "load_threshold")
    await _latency(fdp, clock)
    await clock.advance(0.3)
    assert fdp.status()["width"] == 2 and fdp.status()["history"][0]["width"] == 2
    await fdp.aclose()
