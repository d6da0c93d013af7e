"""Spans of a RequestTrace nest and propagate to the next hop, the node's reported hop
included (clamped to the attempt's forward time; a relay marks the attempt); the Tracer
keeps the newest N."""

from __future__ import annotations

from typing import Any

import pytest

from llmfabric.ingress.tracing import RequestTrace, Tracer
from llmfabric.telemetry.node_hop import NO_HOP, NodeHop
from llmfabric.telemetry.tracecontext import parse_traceparent

pytestmark = pytest.mark.unit

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_request_trace_spans_nest_and_propagate() -> None:
    parent = parse_traceparent(VALID)
    tr = RequestTrace(parent, 1000.0)
    assert tr.trace_id == parent.trace_id if parent else False
    tr.phase("auth", key_id="k1")
    tr.phase("route")
    tr.open_attempt("node-a")
    sent = parse_traceparent(tr.downstream)
    assert sent is not None and sent.trace_id == tr.trace_id and sent.flags == 1
    tr.close_attempt(None, "refused")  # a failed attempt: forward only
    assert tr.downstream == ""
    tr.phase("route")
    tr.open_attempt("node-b")
    tr.first_byte()
    tr.close_attempt(200)
    doc = tr.to_json(200)
    spans = {s["span_id"]: s for s in doc["spans"]}
    root = doc["spans"][0]
    assert root["name"] == "ingress.request" and root["parent_id"] == parent.span_id
    attempts = [s for s in doc["spans"] if s["name"] == "attempt"]
    assert [a["attrs"]["node"] for a in attempts] == ["node-a", "node-b"]
    assert [a["attrs"]["attempt"] for a in attempts] == [0, 1]  # (numbered by the trace)
    assert attempts[0]["attrs"]["error"] == "refused" and attempts[1]["attrs"]["status"] == 200
    assert sent.span_id == attempts[0]["span_id"]  # the node's parent is the attempt
    kids = sorted(s["name"] for s in doc["spans"] if s["parent_id"] == attempts[1]["span_id"])
    assert kids == ["forward", "stream"]
    for s in doc["spans"][1:]:
        assert s["parent_id"] in spans and s["start_ms"] <= s["end_ms"] <= root["end_ms"]


def test_tracer_ring_keeps_the_newest() -> None:
    tracer = Tracer(keep=3, wall=lambda: 5.0)
    ids = []
    for _ in range(5):
        tr = tracer.begin(parse_traceparent("nonsense"))  # malformed: a fresh trace each time
        ids.append(tr.trace_id)
        tracer.finish(tr, 200)
    assert len(set(ids)) == 5
    assert [t["trace_id"] for t in tracer.recent(10)] == ids[:1:-1]
    assert [t["trace_id"] for t in tracer.recent(1)] == ids[-1:]
    assert tracer.recent(0) == []


def _attempt_with(hop: NodeHop) -> dict[str, Any]:
    tr = RequestTrace(None, 1000.0)
    tr.open_attempt("node-1")
    tr.upstream(hop)
    tr.first_byte()
    tr.close_attempt(200)
    return tr.to_json(200)


def test_the_nodes_hop_is_a_clamped_child_of_forward() -> None:
    doc = _attempt_with(NodeHop(node_ms=1e9))  # a node claiming 11 days
    by = {s["name"]: s for s in doc["spans"]}
    fwd, node = by["forward"], by["node"]
    assert node["parent_id"] == fwd["span_id"] and by["attempt"]["span_id"] == fwd["parent_id"]
    assert node["start_ms"] == fwd["start_ms"] and node["end_ms"] <= fwd["end_ms"]
    assert node["attrs"] == {"reported_ms": 1e9, "clamped": True}
    short = {s["name"]: s for s in _attempt_with(NodeHop(node_ms=0.0))["spans"]}
    assert short["node"]["attrs"] == {"reported_ms": 0.0, "clamped": False}
    assert short["forward"]["start_ms"] <= short["node"]["start_ms"] == short["node"]["end_ms"]


def test_no_report_no_node_span_and_relays_mark_the_attempt() -> None:
    plain = _attempt_with(NO_HOP)
    assert "node" not in {s["name"] for s in plain["spans"]}
    [attempt] = [s for s in plain["spans"] if s["name"] == "attempt"]
    assert "via" not in attempt["attrs"]
    relayed = _attempt_with(NodeHop(relay="relay-peer-7"))
    [attempt] = [s for s in relayed["spans"] if s["name"] == "attempt"]
    assert attempt["attrs"]["via"] == "relay" and attempt["attrs"]["relay"] == "relay-peer-7"
