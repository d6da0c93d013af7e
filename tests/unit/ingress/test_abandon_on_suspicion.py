"""The ingress drops an attempt still waiting for its first byte when the membership marks
its node suspected (or gone) and retries another node; a stream that already reached the
client is never cut by suspicion; the watch is gone after every attempt.

A real registry replica (fake clock) behind the real ReplicaCandidateSource and the real
request core; the forwarder stands in for a cut-off site: the first node it is asked for
never answers (as when every packet to it is dropped) until the test lets it. No wall-clock
time is involved: "at once" is "within a few turns of the event loop, no timer expiring"
(the timeouts are an hour).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import orjson
import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.ingress import IngressConfig, Timeouts
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import UpstreamError
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.telemetry.node_hop import NO_HOP
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.sinks import MemorySink

HOUR = Timeouts(connect=3600, first_byte=3600, idle=3600, total=3600)
CHAT = "/v1/chat/completions"


def _event(text: str, finish: str | None = None) -> bytes:
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
            }
        )
        + b"\n\n"
    )


class _Upstream:
    status = 200
    hop = NO_HOP

    def __init__(self, node: str, stream: bool, hold_after_first: asyncio.Event | None) -> None:
        self.node = node
        self.content_type = "text/event-stream" if stream else "application/json"
        self._hold = hold_after_first
        self.closed = False

    async def read(self) -> bytes:
        return orjson.dumps({"node": self.node})

    async def read_capped(self, limit: int) -> bytes:
        return await self.read()

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        yield _event(f"from {self.node}")
        if self._hold is not None:
            await self._hold.wait()
        yield _event(" done", "stop") + b"data: [DONE]\n\n"

    def socket_relay(self) -> None:
        return None

    async def aclose(self) -> None:
        self.closed = True


class _CutSite:
    """The first node asked never answers until `release` (its packets are dropped); with
    `stall_after_first`, it answers its first chunk and then stalls instead."""

    def __init__(self, enforces_timeouts: bool, stall_after_first: bool = False) -> None:
        self.enforces_timeouts = enforces_timeouts
        self.stall_after_first = stall_after_first
        self.cut: str | None = None
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[str] = []
        self.cancelled: list[str] = []

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> _Upstream:
        sid = candidate.session_id
        self.sent.append(sid)
        stream = orjson.loads(body).get("stream") is True
        if self.cut is None:
            self.cut = sid
            if self.stall_after_first:
                self.waiting.set()
                return _Upstream(sid, stream, self.release)
            self.waiting.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(sid)
                raise
        return _Upstream(sid, stream, None)

    async def aclose(self) -> None:
        return None


class _Fabric:
    def __init__(self, n: int = 3) -> None:
        self.clock = FakeClock()
        self.keys = [NodeKey.generate() for _ in range(n)]
        self.owners = []
        self.replica = Replica(self.clock)
        for k in self.keys:
            o = RecordOwner(k, NodeMeta(models=(ServedModel("m"),)), wall=self.clock.wall())
            self.replica.apply(o.set_state(Lifecycle.SERVING, wall=self.clock.wall()))
            self.owners.append(o)
        self.source = ReplicaCandidateSource(lambda: self.replica)

    def suspect(self, sid: str) -> None:
        """Another member's probes of `sid` failed: its SUSPECT fact reaches our replica."""
        o = next(o for o in self.owners if o.session_id == sid)
        author = next(k for k in self.keys if k.peer_id != o.record.peer_id)
        self.replica.apply(
            make_fact(author, FactKind.SUSPECT, sid, o.record.incarnation, self.clock.wall())
        )

    def leave(self, sid: str) -> None:
        o = next(o for o in self.owners if o.session_id == sid)
        self.replica.apply(o.set_state(Lifecycle.LEFT, wall=self.clock.wall()))


async def _turns(task: asyncio.Task[object], n: int = 50) -> None:
    """Let the loop run a few turns (no timer can expire in them: the timeouts are an hour)."""
    for _ in range(n):
        if task.done():
            return
        await asyncio.sleep(0)


def _ingress(fab: _Fabric, fwd: _CutSite) -> Ingress:
    return Ingress(IngressConfig(auth_enabled=False, timeouts=HOUR, max_retries=2), fab.source, fwd)


async def _chat_held_at_cut(fab: _Fabric, fwd: _CutSite) -> asyncio.Task[Any]:
    """A non-streamed chat through a fresh ingress, once the forwarder holds its attempt on
    the node it cuts off (`fwd.cut`)."""
    body = orjson.dumps({"model": "m", "messages": []})
    task = asyncio.ensure_future(_ingress(fab, fwd).serve(CHAT, True, "", None, body, MemorySink()))
    await fwd.waiting.wait()
    assert fwd.cut is not None
    return task


@pytest.mark.parametrize("enforces_timeouts", [True, False])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_node_suspected_before_its_first_byte_is_dropped_and_another_answers(
    stream: bool, enforces_timeouts: bool
) -> None:
    fab = _Fabric()
    fwd = _CutSite(enforces_timeouts)
    ing = _ingress(fab, fwd)
    sink = MemorySink()
    body = orjson.dumps({"model": "m", "messages": [], "stream": stream})
    task = asyncio.ensure_future(ing.serve(CHAT, True, "", None, body, sink))
    await fwd.waiting.wait()
    assert fwd.cut is not None and len(fab.source.down) == 1  # the attempt watches its node
    fab.suspect(fwd.cut)
    await _turns(task)
    assert task.done(), "the attempt kept waiting on a suspected node"
    reply = task.result()
    other = fwd.sent[1]
    assert fwd.sent == [fwd.cut, other] and other != fwd.cut
    assert fwd.cancelled == [fwd.cut]  # the wait on the cut node was really given up
    if stream:
        assert reply is None and sink.node == other and sink.ended
        assert sink.data == (
            _event(f"from {other}") + _event(" done", "stop") + b"data: [DONE]\n\n"
        )
    else:
        assert reply is not None and reply.status == 200
        assert orjson.loads(reply.body) == {"node": other}
    assert ing.metrics.failed_attempts == {fwd.cut: 1}  # counted as a failed attempt, retried
    assert sum(ing.metrics.retries.values()) == 1
    assert len(fab.source.down) == 0  # no watch left behind


async def test_a_node_leaving_before_its_first_byte_is_dropped_too() -> None:
    fab = _Fabric()
    fwd = _CutSite(enforces_timeouts=True)
    task = await _chat_held_at_cut(fab, fwd)
    fab.leave(fwd.cut)
    await _turns(task)
    assert task.done() and fwd.cancelled == [fwd.cut]
    reply = task.result()
    assert reply is not None and orjson.loads(reply.body) == {"node": fwd.sent[1]}
    assert len(fab.source.down) == 0


async def test_a_stream_that_reached_the_client_is_not_cut_by_suspicion() -> None:
    fab = _Fabric()
    fwd = _CutSite(enforces_timeouts=True, stall_after_first=True)
    ing = _ingress(fab, fwd)
    sink = MemorySink()
    body = orjson.dumps({"model": "m", "messages": [], "stream": True})
    task = asyncio.ensure_future(ing.serve(CHAT, True, "", None, body, sink))
    await fwd.waiting.wait()
    await sink.wrote.wait()  # its first chunk reached the client
    assert fwd.cut is not None and len(fab.source.down) == 0  # not watched while relaying
    fab.suspect(fwd.cut)
    await _turns(task)
    assert not task.done()  # still relaying from the suspected node
    fwd.release.set()  # the suspicion was false: it goes on
    assert await task is None
    assert fwd.sent == [fwd.cut] and sink.node == fwd.cut and sink.ended
    assert sink.data == (_event(f"from {fwd.cut}") + _event(" done", "stop") + b"data: [DONE]\n\n")
    assert ing.metrics.failed_attempts == {}


async def test_a_suspicion_after_the_answer_or_without_membership_changes_nothing() -> None:
    fab = _Fabric()
    fwd = _CutSite(enforces_timeouts=True)
    fwd.release.set()  # every node answers at once
    ing = _ingress(fab, fwd)
    body = orjson.dumps({"model": "m", "messages": []})
    reply = await ing.serve(CHAT, True, "", None, body, MemorySink())
    assert reply is not None and reply.status == 200 and len(fab.source.down) == 0
    assert fwd.cut is not None
    fab.suspect(fwd.cut)  # (nothing watches it any more: no stray cancellation)
    reply = await ing.serve(CHAT, True, "", None, body, MemorySink())
    assert reply is not None and reply.status == 200


async def test_a_client_gone_while_waiting_stays_a_cancellation_and_unwatches() -> None:
    fab = _Fabric()
    fwd = _CutSite(enforces_timeouts=True)
    ing = _ingress(fab, fwd)
    body = orjson.dumps({"model": "m", "messages": []})
    task = asyncio.ensure_future(ing.serve(CHAT, True, "", None, body, MemorySink()))
    await fwd.waiting.wait()
    task.cancel()  # the client went away
    assert fwd.cut is not None
    fab.suspect(fwd.cut)  # in the same turn: ours must not swallow the client's cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fwd.sent == [fwd.cut] and len(fab.source.down) == 0


class _BreaksThenCut(_CutSite):
    """The first node streams its first chunk and then breaks (it died mid-stream); the next
    one asked, for the continuation, never answers (cut off); any other answers."""

    def __init__(self) -> None:
        super().__init__(enforces_timeouts=True)
        self.broke: str | None = None

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> _Upstream:
        if self.broke is None:
            self.broke = candidate.session_id
            self.sent.append(candidate.session_id)
            return _Broken(candidate.session_id)
        return await super().open(candidate, path, body, timeouts)


class _Broken(_Upstream):
    def __init__(self, node: str) -> None:
        super().__init__(node, True, None)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        yield _event(f"from {self.node}")
        raise UpstreamError(f"{self.node} died")


async def test_a_continuation_waiting_on_a_node_suspected_meanwhile_moves_on() -> None:
    fab = _Fabric()
    fwd = _BreaksThenCut()
    ing = _ingress(fab, fwd)
    sink = MemorySink()
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    task = asyncio.ensure_future(ing.serve(CHAT, True, "", None, body, sink))
    await fwd.waiting.wait()  # the continuation's node is cut off
    assert fwd.cut is not None and fwd.cut != fwd.broke and len(fab.source.down) == 1
    fab.suspect(fwd.cut)
    await _turns(task)
    assert task.done() and task.result() is None and fwd.cancelled == [fwd.cut]
    last = fwd.sent[2]
    assert fwd.sent == [fwd.broke, fwd.cut, last] and last not in (fwd.broke, fwd.cut)
    assert sink.data.startswith(_event(f"from {fwd.broke}")) and sink.ended
    assert sink.data.endswith(b"data: [DONE]\n\n") and f"from {last}".encode() in sink.data
    assert len(fab.source.down) == 0


class _OthersUnreachable(_CutSite):
    """The first node asked never answers until asked again; every other node is
    unreachable (a partition healing: the suspicion of the local node is false, the far
    node is still cut off)."""

    async def open(
        self, candidate: Candidate, path: str, body: bytes, timeouts: Timeouts
    ) -> _Upstream:
        if self.cut is not None and candidate.session_id != self.cut:
            self.sent.append(candidate.session_id)
            raise UpstreamError(f"cannot reach {candidate.session_id}")
        return await super().open(candidate, path, body, timeouts)


async def test_a_node_left_on_suspicion_alone_is_the_last_resort_when_the_others_fail() -> None:
    fab = _Fabric(2)
    fwd = _OthersUnreachable(enforces_timeouts=True)
    task = await _chat_held_at_cut(fab, fwd)
    fab.suspect(fwd.cut)  # false: the node is fine, only some prober lost it
    await _turns(task)
    assert task.done() and fwd.cancelled == [fwd.cut]
    reply = task.result()
    # left on suspicion, the other node unreachable, then the suspected node again: answered
    assert reply is not None and reply.status == 200, reply
    assert orjson.loads(reply.body) == {"node": fwd.cut}
    [other] = [s for s in fwd.sent if s != fwd.cut]
    assert fwd.sent == [fwd.cut, other, fwd.cut]
    assert len(fab.source.down) == 0


async def test_a_node_that_left_is_not_tried_again() -> None:
    fab = _Fabric(2)
    fwd = _OthersUnreachable(enforces_timeouts=True)
    task = await _chat_held_at_cut(fab, fwd)
    fab.leave(fwd.cut)
    await _turns(task)
    reply = task.result()
    assert reply is not None and reply.status == 502  # gone for good: no last resort
    assert fwd.cut not in fwd.sent[1:]
