"""A hostile node's answers to the fleet controller's control requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmfabric.controller.executor import ASSIGN_TIMEOUT_S, RELEASE_TIMEOUT_S, PeerExecutor
from llmfabric.identity import NodeKey
from llmfabric.net.messages import BodyStream, PeerResponse
from llmfabric.scheduler.decisions import Assign, Decision, Release
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


class _Silent:
    """Peers named silent-* accept the connection and never answer; the others answer 200
    (release) or 202 (assignment) after `delay[peer]` seconds of the fake clock."""

    def __init__(self, clock: FakeClock, delay: dict[str, float] | None = None) -> None:
        self.key = NodeKey.generate()
        self.clock = clock
        self.delay = delay or {}
        self.asked: list[tuple[str, str]] = []  # (peer, path) in the order they were sent
        self.in_flight = 0
        self.most_in_flight = 0

    async def request(self, peer: str, method: str, path: str, headers: Any, body: bytes,
                      *, timeout: float) -> PeerResponse:  # noqa: ASYNC109 - a fake
        self.asked.append((peer, path))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if peer.startswith("peer-silent"):
                await self.clock.sleep(10**9)
            await self.clock.sleep(self.delay.get(peer, 0.0))
        finally:
            self.in_flight -= 1
        stream = BodyStream(lambda _n: None, lambda: None)
        stream.push((b"{}", 2))
        stream.push(None)
        return PeerResponse(200 if path.endswith("release") else 202, (), stream, peer)


async def _run_for(clock: FakeClock, coro: Any, seconds: float) -> bool:
    """Run `coro` for `seconds` of the fake clock; whether it finished by then."""
    task = asyncio.create_task(coro)
    await clock.advance(seconds)
    done = task.done()
    if not done:
        await clock.advance(10**4)
    await asyncio.wait_for(task, 5)
    return done


async def test_k_silent_members_cost_a_round_one_timeout_not_k() -> None:
    """An assignment's nodes were asked one at a time: k members that never answer held the
    round k x 30 s (and all placement with it). They are asked at once, each with its own
    timeout; every honest node still gets its assignment."""
    clock = FakeClock()
    transport = _Silent(clock)
    ex = PeerExecutor(transport, lambda sid: f"peer-{sid}")  # type: ignore[arg-type]
    sids = ("a", *(f"silent-{i}" for i in range(6)), "z")
    decision = Assign("Llama-2-7b", "A100-80GB", 4, 1, sids, "sim", (0, 1, 2, 3))
    assert await _run_for(clock, ex.apply(decision), ASSIGN_TIMEOUT_S + 1)
    assert [sid for sid, _, _ in ex.results] == ["a", "z"]
    assert [f.split(":")[0] for f in ex.failures] == [f"silent-{i}" for i in range(6)]


async def test_a_round_of_several_decisions_costs_one_release_and_one_assign_timeout() -> None:
    """Silent nodes spread over a round's decisions (releases and assignments of several
    models) cost it at most one release timeout plus one assignment timeout. A node whose
    release failed is not sent its assignment."""
    clock = FakeClock()
    transport = _Silent(clock)
    ex = PeerExecutor(transport, lambda sid: f"peer-{sid}")  # type: ignore[arg-type]
    round_: list[Decision] = [
        Release("silent-r", "Qwen3-1.7B", "reclaimed by the placement"),
        Release("b", "Qwen3-1.7B", "reclaimed by the placement"),
        Assign("Llama-2-7b", "A100-80GB", 4, 1, ("b", "silent-1"), "sim", (0, 1, 2, 3)),
        Assign("Llama-2-13b", "A100-80GB", 4, 1, ("silent-2", "silent-r"), "sim",
               (0, 1, 2, 3)),
        Assign("Qwen3-1.7B", "A100-80GB", 1, 4, ("c", "silent-3"), "sim", (0, 1, 2, 3)),
    ]
    assert await _run_for(clock, ex.apply_all(round_), RELEASE_TIMEOUT_S + ASSIGN_TIMEOUT_S
                          + 1)
    assert ("peer-silent-r", "/_fabric/v1/assign") not in transport.asked
    assert [sid for sid, _, _ in ex.results] == ["b", "b", "c"]
    assert [f.split(":")[0] for f in ex.failures] == [
        "silent-r", "silent-r", "silent-1", "silent-2", "silent-3"]
    assert "not sent" in ex.failures[1]


async def test_answers_in_any_order_are_kept_in_decision_order_and_fan_out_is_bounded(
) -> None:
    clock = FakeClock()
    sids = tuple(f"n{i:02d}" for i in range(40))
    transport = _Silent(clock, {f"peer-{s}": 20.0 - i * 0.4 for i, s in enumerate(sids)})
    ex = PeerExecutor(transport, lambda sid: f"peer-{sid}", fan_out=16)  # type: ignore[arg-type]
    decision = Assign("Llama-2-7b", "A100-80GB", 4, 1, sids, "sim", (0, 1, 2, 3))
    assert await _run_for(clock, ex.apply(decision), 3 * ASSIGN_TIMEOUT_S)
    assert transport.most_in_flight == 16
    assert [sid for sid, _, _ in ex.results] == list(sids) and ex.failures == []
