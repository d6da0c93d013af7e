"""The reference engine's scheduler against hostile sampling parameters (no torch: a fake
executor hands out logits). Any exception in a step is an engine failure: the server fails
every request and exits (engine.py `_loop`), so one request must never raise there."""

from __future__ import annotations

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
