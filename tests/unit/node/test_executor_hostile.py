"""A hostile node's answers to the fleet controller's control requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmfabric.identity import NodeKey
from llmfabric.net.messages import BodyStream, PeerResponse
from llmfabric.node.executor import ASSIGN_TIMEOUT_S, PeerExecutor
from llmfabric.scheduler.decisions import Assign
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.hostile


class _Transport:
    """Answers with status 202 and `body`; peer-evil's answer (or all, `body` None) never
    ends."""

    def __init__(self, clock: FakeClock, body: bytes | None) -> None:
        self.key = NodeKey.generate()
        self.clock = clock
        self.body = body
        self.streams: list[BodyStream] = []

    async def request(self, peer: str, method: str, path: str, headers: Any, body: bytes,
                      *, timeout: float) -> PeerResponse:  # noqa: ASYNC109 - a fake
        stream = BodyStream(lambda _n: None, lambda: None)
        if self.body is not None and peer != "peer-evil":
            stream.push((self.body, len(self.body)))
            stream.push(None)
        self.streams.append(stream)
        return PeerResponse(202, (), stream, peer)


ASSIGN = Assign("Llama-2-7b", "A100-80GB", 4, 1, ("evil", "honest"), "sim", (0, 1, 2, 3))
BIG = Assign("Llama-2-7b", "A100-80GB", 4, 1, ("a", "b"), "sim", (0, 1, 2, 3))


async def test_an_answer_whose_body_never_ends_does_not_stop_the_controller() -> None:
    """The answer was read without a deadline: a node that sent its headers and then nothing
    held the controller's round, so every later round (all placement) waited for good."""
    clock = FakeClock()
    transport = _Transport(clock, b"{}")
    ex = PeerExecutor(transport, lambda sid: f"peer-{sid}")  # type: ignore[arg-type]
    task = asyncio.create_task(ex.apply(ASSIGN))
    await clock.advance(0)
    await clock.advance(ASSIGN_TIMEOUT_S + 1)  # the hostile node's answer times out
    await clock.advance(0)
    await asyncio.wait_for(task, 1)
    assert len(transport.streams) == 2  # the honest node still got its assignment
    assert [sid for sid, _, _ in ex.results] == ["honest"]
    assert len(ex.failures) == 1 and "evil" in ex.failures[0]


async def test_an_endless_answer_is_cut() -> None:
    """The answer was read whole (and kept in `results`): one of 16 MiB per assignment."""
    clock = FakeClock()
    transport = _Transport(clock, b"x" * (16 << 20))
    ex = PeerExecutor(transport, lambda sid: f"peer-{sid}")  # type: ignore[arg-type]
    await asyncio.wait_for(ex.apply(BIG), 5)
    assert len(ex.failures) == 2 and all("larger than" in f for f in ex.failures)
