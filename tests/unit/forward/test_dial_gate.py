"""DialGate: at most `limit` dials in flight per key, waiters served in arrival order, a
cancelled waiter's turn passed on, nothing left behind once every dial is done."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.forward.dial_gate import DialGate

pytestmark = pytest.mark.unit


async def test_the_limit_holds_per_key_and_waiters_go_in_order() -> None:
    gate = DialGate(2)
    await gate.acquire("a")
    await gate.acquire("a")
    await gate.acquire("b")  # another node is not held up by a's dials
    order: list[int] = []

    async def wait(i: int) -> None:
        await gate.acquire("a")
        order.append(i)

    waiters = [asyncio.create_task(wait(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert order == [] and gate.in_flight("a") == 2
    gate.release("a")
    await asyncio.sleep(0)
    assert order == [0] and gate.in_flight("a") == 2  # the slot passed on, not freed
    gate.release("a")
    gate.release("a")
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    for _ in range(2):
        gate.release("a")
    gate.release("b")
    assert gate.in_flight("a") == gate.in_flight("b") == 0
    assert not gate._busy and not gate._waiting


async def test_a_cancelled_waiter_loses_its_place_and_a_granted_one_hands_it_on() -> None:
    gate = DialGate(1)
    await gate.acquire("a")
    first = asyncio.create_task(gate.acquire("a"))
    second = asyncio.create_task(gate.acquire("a"))
    await asyncio.sleep(0)
    first.cancel()  # cancelled while waiting: it leaves the queue
    await asyncio.gather(first, return_exceptions=True)
    gate.release("a")
    await second
    assert gate.in_flight("a") == 1
    third = asyncio.create_task(gate.acquire("a"))
    await asyncio.sleep(0)
    gate.release("a")  # granted to `third`...
    third.cancel()  # ...which is cancelled before it runs: the slot must not leak
    await asyncio.gather(third, return_exceptions=True)
    assert gate.in_flight("a") == 0 and not gate._waiting


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dial", "done", "cancel"]), st.sampled_from("ab")),
                max_size=40), st.integers(1, 3))
def test_no_key_ever_has_more_than_limit_dials_and_all_is_freed(
    ops: list[tuple[str, str]], limit: int
) -> None:
    async def run() -> None:
        gate = DialGate(limit)
        holding: dict[str, int] = {"a": 0, "b": 0}  # dials that hold a slot
        waiting: dict[str, list[asyncio.Task[None]]] = {"a": [], "b": []}

        async def dial(key: str) -> None:
            await gate.acquire(key)
            holding[key] += 1

        for op, key in ops:
            if op == "dial":
                waiting[key].append(asyncio.create_task(dial(key)))
            elif op == "done" and holding[key]:
                holding[key] -= 1
                gate.release(key)
            elif op == "cancel" and waiting[key]:
                waiting[key].pop().cancel()
            await asyncio.sleep(0)
            for k in "ab":
                waiting[k] = [t for t in waiting[k] if not t.done()]
                assert holding[k] <= limit
                assert gate.in_flight(k) == holding[k] or waiting[k]
        for k in "ab":  # finish everything: every waiter gets its turn, then all is freed
            for t in waiting[k]:
                t.cancel()
            await asyncio.gather(*waiting[k], return_exceptions=True)
            while holding[k]:
                holding[k] -= 1
                gate.release(k)
        assert not gate._busy and not gate._waiting

    asyncio.run(run())
