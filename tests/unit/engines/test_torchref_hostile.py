"""The reference engine's scheduler against hostile sampling parameters (no torch: a fake
executor hands out logits). Any exception in a step is an engine failure: the server fails
every request and exits (engine.py `_loop`), so one request must never raise there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.engines.torchref.config import load_config
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine
from llmfabric.engines.torchref.plans import StepPlan, StepResult
from llmfabric.engines.torchref.scheduler import FlyingScheduler, Request
from llmfabric.engines.torchref.server import ServerConfig, TorchServer
from llmfabric.scheduler.switching import SwitchPolicy, make_policy

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


# -- the server (TorchServer over a scheduler with the fake executor: no engine processes) --

MODEL = "micro-llama"


@contextlib.asynccontextmanager
async def _server(*, loop: bool = True, dp: int = 1, policy: SwitchPolicy | None = None,
                  **options: Any) -> AsyncIterator[tuple[TestClient[web.Request,
                                                                    web.Application],
                                                         FlyingEngine]]:
    widths = (1, 2) if dp == 2 else (1,)
    engine = FlyingEngine(EngineOptions(config=load_config(MODEL), dp=dp, widths=widths,
                                        n_blocks=64, policy=policy, **options))
    engine.scheduler = FlyingScheduler(_Logits(), dp, widths, 64, 16, 2048, policy=policy)
    if loop:
        engine.start_loop()
    client: TestClient[web.Request, web.Application] = TestClient(
        TestServer(TorchServer(engine, ServerConfig()).app()))
    await client.start_server()
    try:
        yield client, engine
    finally:
        await client.close()
        engine.close()


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 3, **extra}


async def test_a_full_waiting_queue_answers_503_with_retry_after() -> None:
    """The waiting queues had no bound: each entry holds its prompt (up to the context) and
    its client's connection, and every step went through all of them."""
    async with _server(loop=False, max_waiting=3) as (client, engine):
        waiting = [asyncio.create_task(client.post("/v1/completions", json=_completion()))
                   for _ in range(3)]
        for _ in range(200):
            if engine.sched.backlog() == 3:
                break
            await asyncio.sleep(0.01)
        assert engine.sched.backlog() == 3
        r = await client.post("/v1/completions", json=_completion())
        assert r.status == 503, await r.text()
        assert r.headers["Retry-After"] == "1"
        err = (await r.json())["error"]
        assert (err["type"], err["code"]) == ("server_error", "engine_overloaded")
        chat = await client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
        assert chat.status == 503
        for _ in range(50):  # the queue drains: the waiting requests finish...
            engine.sched.step()
            await asyncio.sleep(0)
        assert [(await t).status for t in waiting] == [200, 200, 200]
        assert engine.sched.backlog() == 0
        engine.start_loop()  # ...and new ones are taken again
        again = await client.post("/v1/completions", json=_completion())
        assert again.status == 200, await again.text()


async def _settle(engine: FlyingEngine, steps: int = 30) -> None:
    for _ in range(steps):
        engine.sched.step()
        await asyncio.sleep(0)


async def test_a_clients_priority_is_the_operators_to_grant() -> None:
    """A client's `priority` was honoured as sent: it jumped every queue and, under the
    `priority` policy, hard-preempted a group (paused other clients' requests). Clamped to
    EngineOptions.max_priority (0 unless the operator grants more)."""
    async with _server(loop=False, dp=2, policy=make_policy("priority")) as (client, engine):
        task = asyncio.create_task(client.post("/v1/completions",
                                               json=_completion(priority=5, max_tokens=8)))
        await asyncio.sleep(0.05)
        await _settle(engine)
        assert (await task).status == 200
        assert engine.sched.switches == [] and engine.sched.width == 1  # no preempt
    async with _server(loop=False, dp=2, policy=make_policy("priority"),
                       max_priority=1) as (client, engine):
        task = asyncio.create_task(client.post("/v1/completions",
                                               json=_completion(priority=5, max_tokens=8)))
        await asyncio.sleep(0.05)
        engine.sched.step()
        assert engine.sched.running[0].priority == 1  # granted, up to the operator's cap
        await _settle(engine)
        assert (await task).status == 200
        assert engine.sched.switches  # the operator enabled it: bound for it


@pytest.mark.parametrize(("field", "value"), [
    ("seed", -1), ("seed", -(2**63)), ("seed", 2**64), ("seed", 1.5), ("seed", True),
    ("seed", "7"), ("temperature", True), ("priority", True), ("priority", 1.0),
])
async def test_bad_sampling_fields_are_400s_not_engine_failures(field: str, value: Any) -> None:
    """A negative seed raised in numpy's seeding on the scheduler's thread: the client got a
    500 engine_failure (which callers retry on other nodes)."""
    async with _server() as (client, engine):
        r = await client.post("/v1/completions",
                              json=_completion(**{"temperature": 1.0, field: value}))
        assert r.status == 400, await r.text()
        err = (await r.json())["error"]
        assert (err["type"], err["code"], err["param"]) == (
            "invalid_request_error", "invalid_value", field)
        for seed in (0, 2**64 - 1):  # the whole range a seed may take
            ok = await client.post("/v1/completions", json=_completion(temperature=1.0,
                                                                       seed=seed))
            assert ok.status == 200, await ok.text()
        assert engine.failure is None


async def test_more_messages_than_the_context_holds_are_refused_before_validation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing was paid before the context check: every message was validated first (the
    shared edge now counts them on the parsed JSON; a message here is 7 tokens or more)."""
    from llmfabric.engines import protocol as p

    def validated(*_: object, **__: object) -> None:
        raise AssertionError("validated")

    async with _server() as (client, _):
        msgs = [{"role": "tool", "content": ""}] * (2048 // 7 + 1)
        with monkeypatch.context() as m:
            m.setattr(p.ChatRequest, "model_validate", validated)
            r = await client.post("/v1/chat/completions",
                                  json={"model": MODEL, "max_tokens": 1, "messages": msgs})
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "context_length_exceeded"
        ok = await client.post("/v1/chat/completions",
                               json={"model": MODEL, "max_tokens": 1, "messages": msgs[:100]})
        assert ok.status == 200, await ok.text()


async def test_a_step_that_raises_is_printed_with_its_traceback_and_fails_the_engine(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The step loop's death went to /health and the watcher's one-line ERROR only; its
    traceback (what a bug report needs) is in the engine's log now."""
    async with _server(loop=False) as (client, engine):
        def broken() -> bool:
            raise ZeroDivisionError("step bug")

        engine.sched.step = broken  # type: ignore[method-assign]
        engine.start_loop()
        for _ in range(100):
            if engine.failure is not None:
                break
            await asyncio.sleep(0.01)
        assert isinstance(engine.failure, ZeroDivisionError)
        out = capsys.readouterr().out
        assert "torch engine step loop failed" in out and "Traceback" in out
        assert "ZeroDivisionError: step bug" in out
        r = await client.post("/v1/completions", json=_completion())
        assert r.status == 503
