from __future__ import annotations

import asyncio
import pathlib

import pytest

from llmfabric.agent.errors import Draining
from llmfabric.agent.inflight import InflightTracker
from llmfabric.agent.logwatch import DEFAULT_FATAL_PATTERNS, LogWatcher
from llmfabric.testing.fake_clock import FakeClock


async def test_drain_waits_for_inflight() -> None:
    clock = FakeClock()
    t = InflightTracker(clock)
    t.begin()
    t.begin()
    assert t.load_hints().inflight == 2
    t.close()
    with pytest.raises(Draining):
        t.begin()
    waiter = asyncio.create_task(t.drained(10.0))
    await clock.advance(1.0)
    assert not waiter.done()
    t.end()
    t.end()
    await clock.advance(0.0)
    assert waiter.done() and waiter.result() is True


async def test_drain_times_out() -> None:
    clock = FakeClock()
    t = InflightTracker(clock)
    with t.track():
        waiter = asyncio.create_task(t.drained(5.0))
        await clock.advance(5.1)
        assert waiter.result() is False
    assert t.inflight == 0 and await t.drained(0.0)


@pytest.mark.parametrize(
    "line",
    [
        "[rank3]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 ms",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/...",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "NCCL watchdog timeout (simulated)",
    ],
)
def test_fatal_patterns_match(line: str) -> None:
    hits: list[str] = []
    w = LogWatcher(pathlib.Path("/nonexistent"), DEFAULT_FATAL_PATTERNS,
                   lambda ln, _p: hits.append(ln), FakeClock())
    w.feed(b"INFO: all fine\n" + line.encode() + b"\nmore\n")
    assert hits == [line]


def test_partial_lines_and_no_false_positive() -> None:
    hits: list[str] = []
    w = LogWatcher(pathlib.Path("/nonexistent"), DEFAULT_FATAL_PATTERNS,
                   lambda ln, _p: hits.append(ln), FakeClock())
    w.feed(b"INFO: NCCL version 2.21.5 loaded\nCUDA err")
    assert hits == []
    w.feed(b"or: out of bounds\n")
    assert hits == ["CUDA error: out of bounds"]
    assert list(w.tail)[-1] == "CUDA error: out of bounds"
