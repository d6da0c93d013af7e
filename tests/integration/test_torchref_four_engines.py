"""Four engine processes, widths 1, 2 and 4: mixed layouts (a TP pair beside two DP engines),
binding a pair into the full group, and the same greedy tokens in every layout."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

from llmfabric.engines.torchref.config import ByteTokenizer, load_config
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
from llmfabric.engines.torchref.scheduler import Request

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOK = ByteTokenizer()
PROMPTS = [f"four engines, prompt {i}" for i in range(6)]


@pytest.fixture(scope="module")
def engine() -> Iterator[FlyingEngine]:
    opts = EngineOptions(config=load_config("tiny-llama"), dp=4, widths=(1, 2, 4),
                         n_blocks=32, block_tokens=16)
    with FlyingEngine(opts) as eng:
        yield eng


def submit_all(engine: FlyingEngine, n: int = 20) -> list[Request]:
    return [engine.submit(TOK.encode(p), n, ignore_eos=True, record_logits=True)
            for p in PROMPTS]


def settle(engine: FlyingEngine) -> None:
    for _ in range(1000):
        s = engine.sched
        if not s.pending_bind and not s.pending_release and s._unrecorded is None:
            return
        engine.step()
    raise AssertionError("layout did not settle")


def test_every_width_and_a_mixed_layout_agree(engine: FlyingEngine) -> None:
    ready = engine.ready
    # torch registers the groups a rank belongs to: the world, its pair and {0, 1, 2, 3}
    assert all(r["process_groups"] == 3 for r in ready)
    dp = submit_all(engine)
    engine.run_until_done(dp)
    assert {r.home for r in dp} == {(0,), (1,), (2,), (3,)}
    engine.sched.request_bind((0, 1), "hard")  # a TP pair beside two DP engines
    settle(engine)
    assert engine.sched.groups == [(0, 1), (2,), (3,)]
    mixed = submit_all(engine)
    engine.run_until_done(mixed)
    assert {r.home for r in mixed} == {(0, 1), (2,), (3,)}
    engine.switch(4, "hard")
    settle(engine)
    tp4 = submit_all(engine)
    engine.run_until_done(tp4)
    assert all(r.home == (0, 1, 2, 3) for r in tp4)
    for runs in (mixed, tp4):
        for a, b in zip(dp, runs, strict=True):
            assert a.output == b.output
            assert max(float(np.abs(x - y).max())
                       for x, y in zip(a.logits, b.logits, strict=True)) <= 1e-4
    engine.switch(1, "hard")
    settle(engine)
    status = engine.status()
    assert all(e["process_groups_created"] == 3 for e in status["engines"])


def test_binding_over_a_running_pair_recomputes_its_requests(engine: FlyingEngine) -> None:
    engine.switch(1, "hard")
    settle(engine)
    refs = submit_all(engine, 24)
    engine.run_until_done(refs)
    engine.sched.request_bind((0, 1), "hard")
    settle(engine)
    reqs = submit_all(engine, 24)
    for _ in range(5):
        engine.step()
    on_pair = [r for r in reqs if r.home == (0, 1) and r.finish is None]
    assert on_pair
    on_dp = [r for r in reqs if r not in on_pair and r.finish is None]
    assert on_dp
    engine.switch(4, "hard")  # the pair's requests are folded; DP ones pause with their KV
    engine.run_until_done(on_pair)
    assert all(r.folds == 1 and r.home == (0, 1, 2, 3) for r in on_pair)
    assert all(r.finish is None and r.folds == 0 for r in on_dp)  # paused until released
    engine.switch(1, "hard")
    engine.run_until_done(reqs)
    assert [r.output for r in reqs] == [r.output for r in refs]
