"""NodeSupervisor on virtual time: restart policy, take-down, atomic session changes, and a
stop() that is idempotent, races a session change, and leaves nothing running."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from llmfabric.node.supervisor import (
    ONE_SHOT,
    NodeSupervisor,
    RestartPolicy,
    SessionChanged,
    SupervisorStopped,
)
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.unit


class FakeSession:
    """Starts and leaves over a few virtual seconds, so a reader can look in between."""

    made = 0

    def __init__(self, clock: FakeClock, gate: asyncio.Event | None = None) -> None:
        FakeSession.made += 1
        self.name = f"s{FakeSession.made}"
        self.clock = clock
        self.gate = gate
        self.started = self.left = self.closed = False

    async def start(self) -> None:
        await self.clock.sleep(1.0)
        self.started = True

    async def leave(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await self.clock.sleep(1.0)
        self.left = True

    async def aclose(self) -> None:
        self.closed = True


class FakeEngine:
    def __init__(self) -> None:
        self.stopped_with: list[float | None] = []

    async def aclose(self, stop_timeout_s: float | None = None) -> None:
        self.stopped_with.append(stop_timeout_s)


class Downs:
    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException]] = []

    def __call__(self, name: str, exc: BaseException) -> None:
        self.calls.append((name, exc))


def _supervisor(clock: FakeClock) -> tuple[NodeSupervisor[FakeSession, FakeEngine], Downs]:
    downs = Downs()
    return NodeSupervisor(clock, random.Random(1), take_down=downs), downs


async def test_a_crashing_loop_restarts_with_backoff_then_takes_the_node_down() -> None:
    clock = FakeClock()
    sup, downs = _supervisor(clock)
    runs: list[float] = []

    async def crash() -> None:
        runs.append(clock.now())
        await clock.sleep(5.0)
        raise ValueError("boom")

    policy = RestartPolicy(max_restarts=3, backoff_s=10.0, backoff_cap_s=100.0)
    sup.loop("publisher", crash, policy)
    await clock.advance(5.0)
    assert len(runs) == 1 and sup.failures["publisher"] == 1 and not downs.calls
    await clock.advance(5.0)  # the first backoff is 10 s +-25%: no restart yet
    assert len(runs) == 1
    await clock.advance(500.0)
    assert len(runs) == 4  # the first run and three restarts
    assert sup.failures["publisher"] == 4
    gaps = [b - a - 5.0 for a, b in itertools.pairwise(runs)]
    for gap, base in zip(gaps, (10.0, 20.0, 40.0), strict=True):  # exponential, jittered
        assert 0.75 * base <= gap <= 1.25 * base
    assert [name for name, _ in downs.calls] == ["publisher"]  # down once, with the cause
    assert isinstance(downs.calls[0][1], ValueError)
    assert sup.running() == []


async def test_a_loop_that_ran_long_enough_gets_its_restarts_back() -> None:
    clock = FakeClock()
    sup, downs = _supervisor(clock)

    async def crash_after_an_hour() -> None:
        await clock.sleep(3600.0)
        raise RuntimeError("rare")

    sup.loop("rare", crash_after_an_hour, RestartPolicy(max_restarts=1, reset_after_s=600.0))
    await clock.advance(5 * 3700.0)
    assert sup.failures["rare"] == 5 and not downs.calls
    await sup.stop()


async def test_a_one_shot_failure_takes_the_node_down_and_a_clean_return_does_not() -> None:
    clock = FakeClock()
    sup, downs = _supervisor(clock)

    async def done() -> None:
        await clock.sleep(1.0)

    async def fail() -> None:
        raise KeyError("no such session")

    sup.loop("ok", done, ONE_SHOT)
    sup.loop("rejoin", fail, ONE_SHOT)
    await clock.advance(2.0)
    assert [name for name, _ in downs.calls] == ["rejoin"]
    assert sup.failures == {"rejoin": 1}


async def test_one_task_per_name_and_none_once_stopping() -> None:
    clock = FakeClock()
    sup, _ = _supervisor(clock)
    started: list[str] = []

    async def forever(tag: str) -> None:
        started.append(tag)
        await clock.sleep(1e9)

    sup.loop("load", lambda: forever("first"))
    sup.loop("load", lambda: forever("second"))  # already running: left alone
    await clock.settle()
    assert started == ["first"] and sup.running() == ["load"]
    await sup.stop()
    sup.loop("late", lambda: forever("late"))
    await clock.settle()
    assert started == ["first"] and sup.running() == []


async def test_a_session_change_is_atomic_for_readers() -> None:
    clock = FakeClock()
    sup, _ = _supervisor(clock)
    first = await _change(sup, clock)
    seen: list[FakeSession | None] = []
    unstarted: list[FakeSession] = []  # sessions a reader saw before they had started

    async def reader() -> None:
        while True:
            current = sup.session
            seen.append(current)
            if current is not None and not current.started:
                unstarted.append(current)
            await clock.sleep(0.25)

    watching = asyncio.ensure_future(reader())
    change = asyncio.ensure_future(sup.change_session(lambda: FakeSession(clock),
                                                      leave_old=True))
    await clock.advance(5.0)
    second = await change
    watching.cancel()
    assert seen[0] is first and seen[-1] is second
    assert all(s is first or s is second for s in seen)  # never none, never a third
    assert not unstarted  # never a session still starting
    assert first.left and first.closed and second.started and not second.closed
    with pytest.raises(SessionChanged):  # the caller decided about `first`: refused
        await sup.change_session(lambda: FakeSession(clock), expect=first)
    await sup.stop()
    assert second.closed


async def test_a_change_swaps_the_engine_in_the_same_step_and_stops_the_old_one() -> None:
    clock = FakeClock()
    sup, _ = _supervisor(clock)
    await _change(sup, clock)
    old, new = FakeEngine(), FakeEngine()
    sup.install_engine(old)
    with pytest.raises(RuntimeError):
        sup.install_engine(new)  # one engine per node
    await _change(sup, clock, engine=new)
    assert sup.engine is new and old.stopped_with == [2.0] and not new.stopped_with
    await sup.stop(engine_timeout_s=None)
    assert new.stopped_with == [None]


async def test_stop_is_idempotent_and_waits_for_a_session_change_in_flight() -> None:
    clock = FakeClock()
    sup, _ = _supervisor(clock)
    first = await _change(sup, clock)
    gate = asyncio.Event()
    made: list[FakeSession] = []

    def make() -> FakeSession:
        made.append(FakeSession(clock))
        return made[-1]

    first.gate = gate  # leaving the old session blocks until the gate opens
    change = asyncio.ensure_future(sup.change_session(make, leave_old=True))
    engine = FakeEngine()
    sup.own_engine(engine)  # (an engine restart's engine, still starting)

    async def forever() -> None:
        await clock.sleep(1e9)

    sup.loop("load", forever)
    await clock.settle()
    assert sup.begin_stop()
    stops = asyncio.ensure_future(asyncio.gather(sup.stop(), sup.stop()))
    await clock.settle()
    assert not stops.done()  # the change in flight holds it
    with pytest.raises(SupervisorStopped):  # no new change once stopping
        await sup.change_session(make)
    gate.set()
    await clock.advance(5.0)
    await stops
    await change  # the change begun before the stop completed ...
    assert len(made) == 1 and first.closed and made[0].closed  # ... and nothing stays open
    assert engine.stopped_with == [None] and sup.running() == []
    await sup.stop()  # a third call returns at once
    assert not sup.begin_stop()


async def test_stop_cancelling_a_change_still_closes_the_half_built_session() -> None:
    clock = FakeClock()
    sup, _ = _supervisor(clock)
    await _change(sup, clock)
    made: list[FakeSession] = []

    async def rejoin() -> None:
        def make() -> FakeSession:
            made.append(FakeSession(clock))
            return made[-1]
        await sup.change_session(make)

    sup.loop("rejoin", rejoin, ONE_SHOT)
    await clock.advance(0.5)  # the new session is starting (start() takes 1 s)
    assert made and not made[0].started
    await sup.stop()
    assert made[0].closed and sup.running() == []


async def _change(sup: NodeSupervisor[FakeSession, FakeEngine], clock: FakeClock,
                  **kwargs: object) -> FakeSession:
    change = asyncio.ensure_future(sup.change_session(lambda: FakeSession(clock),
                                                      **kwargs))  # type: ignore[arg-type]
    await clock.advance(5.0)
    return await change
