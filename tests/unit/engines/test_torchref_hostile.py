"""The reference engine's scheduler against hostile sampling parameters (no torch: a fake
executor hands out logits). Any exception in a step is an engine failure: the server fails
every request and exits (engine.py `_loop`), so one request must never raise there."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from llmfabric.engines.torchref.plans import StepPlan, StepResult
from llmfabric.engines.torchref.scheduler import FlyingScheduler, Request

pytestmark = pytest.mark.hostile

VOCAB = 260


class _Logits:
    def execute(self, plans: dict[int, StepPlan]) -> list[StepResult]:
        logits = np.linspace(-8.0, 8.0, VOCAB, dtype=np.float32)
        return [StepResult(p.step, rank, None,
                           [(e.rid, logits, None) for e in p.entries] if rank == p.group[0]
                           else [], 0, 0, 0, 0.0)
                for rank, p in plans.items()]


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-300, 1e-6])
def test_a_vanishing_temperature_is_greedy_and_keeps_the_engine_up(temperature: float) -> None:
    """temperature 1e-310 passed the server's [0, 2] check; logits / T overflowed to inf,
    inf - inf gave NaN probabilities and the sampler raised inside the step: one request
    took the whole engine down."""
    sched = FlyingScheduler(_Logits(), 1, (1,), 64, 16, 512)
    events: list[tuple[object, ...]] = []
    r = sched.add(Request([1, 2, 3], 4, sink=events.append, temperature=temperature,
                          ignore_eos=True))
    for _ in range(10):
        if r.finish is not None:
            break
        sched.step()
    assert r.finish == "length" and r.output == [VOCAB - 1] * 4  # greedy: the largest logit
    assert events[-1] == ("done", "length")


class _Counted(Request):
    """A request that counts reads of its priority: each is one look at it while ordering."""

    reads: ClassVar[int] = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "priority":
            _Counted.reads += 1
        return super().__getattribute__(name)


@pytest.mark.parametrize("case", ["batch-full", "kv-short"])
def test_a_step_does_not_read_the_whole_waiting_queue(case: str) -> None:
    """Every step sorted every waiting request (and read each one while admitting when none
    fitted), so 10,000 waiting requests cost a step ~8-27 ms on the shared machine, paid by
    every running request; the queues are kept in order now and a step reads its head."""
    if case == "batch-full":  # one runs, the rest wait for a batch slot
        sched = FlyingScheduler(_Logits(), 1, (1,), 4096, 16, 2048, max_batch=1)
        size = 16
    else:  # one holds 40 of 64 blocks; 24 are free but no waiting request fits in them
        sched = FlyingScheduler(_Logits(), 1, (1,), 64, 16, 2048)
        size = 624
    for _ in range(3001):
        sched.add(_Counted([1] * 16, size, ignore_eos=True))
    sched.step()
    assert len(sched.running) == 1
    _Counted.reads = 0
    sched.step()
    assert _Counted.reads < 512  # (was >= 3,000: a sort and a full scan)
    assert sum(len(q) for q in sched.queues) == 3000


def test_the_queues_keep_priority_fold_and_arrival_order() -> None:
    sched = FlyingScheduler(_Logits(), 1, (1,), 4096, 16, 2048, max_batch=1)
    order: list[int] = []
    reqs = [sched.add(Request([1, 2], 1, priority=p,
                              sink=lambda ev, i=i: order.append(i) if ev[0] == "done" else None))
            for i, p in enumerate([0, 2, 1, 2, 0, -1])]
    sched.cancel(reqs[4])  # a cancelled waiting request leaves its queue at once
    assert reqs[4] not in sched.queues[0] and sched.backlog() == 5
    for _ in range(20):
        sched.step()
    assert order == [1, 3, 2, 0, 5]
    assert sched.backlog() == 0 and not sched.running
