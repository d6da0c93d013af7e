"""A request that moves on to fallback models (the body's `models`) is traced as one
request: the trace hook's `attempts` counts every upstream attempt over all the models
tried (it counted only the last model's), and the trace's attempt spans are numbered over
the request and name the model each was for (they restarted at 0 for each model, without
the model). The prefill/decode path's attempts count, and are spans, too."""

from __future__ import annotations

from typing import Any

import pytest

from llmfabric.ingress.config import TraceEvent
from llmfabric.ingress.errors import Reply, UpstreamError
from llmfabric.ingress.tracing import traced
from llmfabric.registry.records import ModelRole
from llmfabric.routing.candidates import Candidate
from llmfabric.testing.sinks import MemorySink

from .test_model_fallbacks import Up, ask, cand, ingress, served

pytestmark = pytest.mark.unit


def _big_fails(c: Candidate, doc: dict[str, Any]) -> Up:
    if c.model.id == "big":
        raise UpstreamError(f"node {c.session_id} refused the connection")
    return served(doc)


async def _traced_ask(ing: Any, doc: dict[str, Any], stream: bool = False
                      ) -> tuple[Reply | None, list[dict[str, Any]]]:
    """Ask under a trace, as the fronts do; the attempt spans' attrs, in order."""
    sink = MemorySink()
    reply = await traced(ing.tracer, None, sink, lambda: ask(ing, doc, stream=stream,
                                                             sink=sink))
    [trace] = ing.tracer.recent(1)
    spans = sorted((s for s in trace["spans"] if s["name"] == "attempt"),
                   key=lambda s: s["start_ms"])
    return reply, [s["attrs"] for s in spans]


def _tried(attempts: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    return [(a["attempt"], a["model"], a["node"]) for a in attempts]


@pytest.mark.parametrize("stream", [False, True])
async def test_attempts_are_counted_and_named_over_every_model_tried(stream: bool) -> None:
    events: list[TraceEvent] = []
    cands = [cand("b1", "big"), cand("b2", "big"), cand("s1", "small")]
    ing, fwd, _ = ingress(cands, _big_fails, trace_hook=events.append)  # (max_retries 1)
    reply, attempts = await _traced_ask(ing, {"model": "big", "models": ["small"]}, stream)
    assert reply is None if stream else reply is not None and reply.status == 200
    assert len(fwd.sent) == 3  # two nodes of big, then small's
    [event] = events
    assert event.attempts == 3 and event.model == "small" and event.node == "s1"
    assert [(a["attempt"], a["model"]) for a in attempts] == [
        (0, "big"), (1, "big"), (2, "small")]
    assert [a["node"] for a in attempts] == fwd.nodes() and fwd.nodes()[2] == "s1"
    assert [a["status"] for a in attempts] == [None, None, 200]


async def test_an_engines_answer_then_a_fallback_counts_both() -> None:
    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        return Up(501, b'{"error": {"message": "no"}}') if c.model.id == "big" else \
            served(doc)

    events: list[TraceEvent] = []
    ing, _, _ = ingress([cand("b1", "big"), cand("s1", "small")], script,
                        trace_hook=events.append, max_retries=0)
    _, attempts = await _traced_ask(ing, {"model": "big", "models": ["small"]})
    assert [e.attempts for e in events] == [2]
    assert _tried(attempts) == [(0, "big", "b1"), (1, "small", "s1")]
    assert [a["status"] for a in attempts] == [501, 200]


async def test_models_without_a_route_add_no_attempts() -> None:
    events: list[TraceEvent] = []
    ing, _, _ = ingress(trace_hook=events.append)
    _, attempts = await _traced_ask(ing, {"model": "gone", "models": ["big"]})
    assert [e.attempts for e in events] == [1]
    assert _tried(attempts) == [(0, "big", "b1")]


async def test_when_every_model_fails_the_502_counts_them_all() -> None:
    events: list[TraceEvent] = []
    cands = [cand("b1", "big"), cand("b2", "big"), cand("s1", "small")]

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        raise UpstreamError(f"node {c.session_id} refused the connection")

    ing, _, _ = ingress(cands, script, trace_hook=events.append)
    reply, attempts = await _traced_ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 502
    [event] = events
    assert event.attempts == 3 and event.status == 502 and event.node is None
    assert [(a["attempt"], a["model"]) for a in attempts] == [
        (0, "big"), (1, "big"), (2, "small")]


async def test_the_prefill_decode_path_counts_and_traces_its_attempts() -> None:
    import orjson

    handle = orjson.dumps({"id": "p", "choices": [], "kv_transfer_params": {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1]}})

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.session_id == "pre":
            return Up(body=handle)
        if c.session_id == "dec":
            raise UpstreamError("the decode node is gone")
        return served(doc)

    events: list[TraceEvent] = []
    cands = [cand("pre", "big", role=ModelRole.PREFILL),
             cand("dec", "big", role=ModelRole.DECODE), cand("s1", "small")]
    ing, fwd, _ = ingress(cands, script, trace_hook=events.append)
    reply, attempts = await _traced_ask(ing, {"model": "big", "models": ["small"]})
    assert reply is not None and reply.status == 200 and reply.model == "small"
    assert fwd.nodes() == ["pre", "dec", "s1"]
    assert [e.attempts for e in events] == [3]
    assert [(a["attempt"], a["model"], a["node"], a.get("phase")) for a in attempts] == [
        (0, "big", "pre", "prefill"), (1, "big", "dec", "decode"), (2, "small", "s1", None)]


async def test_a_request_without_models_counts_its_retries() -> None:
    events: list[TraceEvent] = []
    cands = [cand("b1", "big"), cand("b2", "big")]

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        if c.session_id == fail_first[0]:
            raise UpstreamError("refused")
        return served(doc)

    fail_first = [""]
    ing, fwd, _ = ingress(cands, script, trace_hook=events.append)
    _, attempts = await _traced_ask(ing, {"model": "big"})
    assert [e.attempts for e in events] == [1] and len(attempts) == 1
    fail_first[0] = fwd.nodes()[0]  # that node now refuses: a retry on the other
    events.clear()
    fwd.sent.clear()
    for _ in range(20):  # (until the policy picks the refusing node first)
        events.clear()
        fwd.sent.clear()
        _, attempts = await _traced_ask(ing, {"model": "big"})
        if len(fwd.sent) == 2:
            break
    assert [e.attempts for e in events] == [2]
    assert [(a["attempt"], a["model"]) for a in attempts] == [(0, "big"), (1, "big")]


async def test_an_attempt_left_on_suspicion_still_counts() -> None:
    """A node abandoned while only suspected is taken out of `tried` (to be tried again as a
    last resort): its attempt was made all the same, and is counted (it was not)."""
    from llmfabric.ingress.attempt import NodeDown

    events: list[TraceEvent] = []
    calls: list[str] = []

    def script(c: Candidate, doc: dict[str, Any]) -> Up:
        calls.append(c.session_id)
        if len(calls) == 1:
            raise NodeDown(f"node {c.session_id} is suspected", gone=False)
        if len(calls) == 2:
            raise UpstreamError(f"node {c.session_id} refused the connection")
        return served(doc)  # the suspected one, tried again last

    ing, _, _ = ingress([cand("b1", "big"), cand("b2", "big")], script,
                        trace_hook=events.append, max_retries=2)
    reply, attempts = await _traced_ask(ing, {"model": "big"})
    assert reply is not None and reply.status == 200
    assert calls[2] == calls[0]
    assert [e.attempts for e in events] == [3]
    assert [a["attempt"] for a in attempts] == [0, 1, 2]
