"""Fair queueing: past its capacity, a flooding owner cannot starve another; refusals carry
an expected wait; cancelled waiters give their slot on."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.accounts.fairqueue import FairQueue, QueueRefused

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_light_owner_overtakes_a_flood() -> None:
    clock = Clock()
    q = FairQueue(2, now=clock)
    order: list[str] = []

    async def req(owner: str) -> None:
        got = await q.acquire(owner, 100)
        assert not isinstance(got, QueueRefused)
        order.append(owner)

    held = [await q.acquire("flood", 100), await q.acquire("flood", 100)]
    assert q.inflight == 2
    flood = [asyncio.create_task(req("flood")) for _ in range(40)]
    await _settle()
    light = asyncio.create_task(req("light"))
    await _settle()
    assert q.waiting("flood") == 40 and q.waiting("light") == 1
    clock.t = 1.0
    q.release(held[0])  # one slot frees: the light owner gets it before 40 flood requests
    await _settle()
    assert order == ["light"]
    await light
    # and the flood drains afterwards, one slot at a time
    for _ in range(41):
        q.release(0.0)
        await _settle()
    await asyncio.gather(*flood)
    assert order.count("flood") == 40 and q.waiting() == 0


async def test_owners_alternate_when_both_flood() -> None:
    q = FairQueue(1, now=Clock())
    first = await q.acquire("a", 10)
    order: list[str] = []

    async def req(owner: str) -> None:
        await q.acquire(owner, 10)
        order.append(owner)

    tasks = [asyncio.create_task(req("a")) for _ in range(5)]
    await _settle()
    tasks += [asyncio.create_task(req("b")) for _ in range(5)]
    await _settle()
    q.release(first)
    for _ in range(10):
        await _settle()
        q.release(0.0)
    await asyncio.gather(*tasks)
    # b joins late but is lifted to a's counter, not below it: strict alternation
    assert order[:6] in (["a", "b"] * 3, ["b", "a"] * 3)
    assert order.count("a") == order.count("b") == 5


async def test_full_queue_and_timeout_refuse_with_an_expected_wait() -> None:
    clock = Clock()
    q = FairQueue(1, max_waiting_per_owner=2, max_wait_s=0.01, now=clock)
    start = await q.acquire("a", 1)
    assert isinstance(start, float)
    clock.t = 4.0
    q.release(start)  # one request held its slot 4 s: the mean moves towards 4
    hold = await q.acquire("a", 1)
    assert isinstance(hold, float)
    waiters = [asyncio.create_task(q.acquire("a", 1)) for _ in range(2)]
    await _settle()
    full = await q.acquire("a", 1)
    assert isinstance(full, QueueRefused) and full.reason == "queue_full"
    assert full.retry_after_s > 0 and full.waiting == 2
    timed_out = await asyncio.gather(*waiters)
    assert all(isinstance(r, QueueRefused) and r.reason == "queue_timeout" for r in timed_out)
    assert q.waiting() == 0 and q.refused_total == 3


async def test_a_cancelled_waiter_leaves_no_slot_behind() -> None:
    q = FairQueue(1, now=Clock())
    first = await q.acquire("a", 1)
    waiter = asyncio.create_task(q.acquire("b", 1))
    await _settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert q.waiting() == 0
    q.release(first)
    assert q.inflight == 0
    assert isinstance(await q.acquire("c", 1), float)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FairQueue(0, now=Clock())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.sampled_from(["a", "b", "c", "release",
                                                              "cancel"]),
                                             st.integers(1, 50)), max_size=40))
def test_slots_are_never_oversubscribed_and_every_waiter_is_served(
        capacity: int, ops: list[tuple[str, int]]) -> None:
    """Law: whatever the interleaving of arrivals, releases and cancellations, at most
    `capacity` requests hold a slot, and once everything is released every request that was
    not cancelled got its slot."""

    async def run() -> None:
        q = FairQueue(capacity, max_waiting_per_owner=1000, now=Clock())
        holders: list[asyncio.Task[float | QueueRefused]] = []
        for op, cost in ops:
            if op == "release":
                done = [t for t in holders if t.done() and not t.cancelled()]
                if done:
                    holders.remove(done[0])
                    q.release(0.0)
            elif op == "cancel":
                waiting = [t for t in holders if not t.done()]
                if waiting:
                    waiting[0].cancel()
                    holders.remove(waiting[0])
            else:
                holders.append(asyncio.create_task(q.acquire(op, cost)))
            await _settle()
            assert 0 <= q.inflight <= capacity
            granted = sum(1 for t in holders if t.done() and not t.cancelled())
            assert granted == q.inflight
        while holders:
            await _settle()
            done = [t for t in holders if t.done()]
            assert done, "a waiter was never served"
            holders.remove(done[0])
            assert isinstance(done[0].result(), float)
            q.release(0.0)
        assert q.inflight == 0 and q.waiting() == 0

    asyncio.run(run())
