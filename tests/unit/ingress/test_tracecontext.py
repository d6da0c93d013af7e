"""W3C traceparent: valid headers parse and round-trip; anything else (malformed, oversized,
forbidden values) is refused so a new trace starts; spans of a RequestTrace nest, the node's
reported hop included (validated, clamped)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.ingress.tracing import RequestTrace, Tracer
from llmfabric.telemetry.node_hop import NO_HOP, NodeHop, node_time_value, parse_node_time
from llmfabric.telemetry.tracecontext import MAX_HEADER_CHARS, TraceParent, parse_traceparent

pytestmark = pytest.mark.unit

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
hexs = st.text(alphabet="0123456789abcdef", min_size=1, max_size=1)


def test_valid_header_parses() -> None:
    tp = parse_traceparent(VALID)
    assert tp == TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert tp.sampled and tp.header() == VALID
    assert parse_traceparent(VALID.encode()) == tp
    assert parse_traceparent(" " + VALID + "\t") == tp  # optional whitespace around it
    # a later version may append fields after a dash
    later = parse_traceparent("cc" + VALID[2:] + "-what-the-future-holds")
    assert later is not None and later.trace_id == tp.trace_id


@pytest.mark.parametrize("bad", [
    None, "", "00", "garbage",
    VALID.upper(),  # uppercase hex is invalid
    "ff" + VALID[2:],  # version ff is forbidden
    VALID + "-extra",  # version 00 is exactly 55 characters
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # all-zero span id
    VALID.replace("-", "_"),
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  # non-hex
    "01" + VALID[2:] + "x",  # a later version, but no dash after the known fields
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",  # short flags
    "\x00" * 55,
    "00-" + "a" * 10_000,  # huge
    ("cc" + VALID[2:] + "-" + "x" * MAX_HEADER_CHARS),  # over the cap
    b"\xff" * 55,
])
def test_invalid_headers_are_refused(bad: str | bytes | None) -> None:
    assert parse_traceparent(bad) is None


@given(st.text(max_size=80))
def test_arbitrary_text_never_raises_and_valid_results_round_trip(text: str) -> None:
    tp = parse_traceparent(text)
    if tp is not None:
        assert parse_traceparent(tp.header()) == tp


@given(st.lists(hexs, min_size=32, max_size=32), st.lists(hexs, min_size=16, max_size=16),
       st.integers(0, 255))
def test_round_trip(trace: list[str], span: list[str], flags: int) -> None:
    t, s = "".join(trace), "".join(span)
    tp = TraceParent(t, s, flags)
    got = parse_traceparent(tp.header())
    if set(t) == {"0"} or set(s) == {"0"}:
        assert got is None
    else:
        assert got == tp


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


@pytest.mark.parametrize("raw", ["12.5", b"0", "0.000", " 3 "])
def test_node_time_accepts_small_finite_decimals(raw: str | bytes) -> None:
    assert parse_node_time(raw) == float(raw)


@pytest.mark.parametrize("raw", [None, "", "-1", "nan", "inf", "1e400", "x", "1" * 40, b"\xff"])
def test_node_time_drops_anything_else(raw: str | bytes | None) -> None:
    assert parse_node_time(raw) is None


@given(st.one_of(st.text(max_size=40), st.binary(max_size=40)))
def test_node_time_never_raises(raw: str | bytes) -> None:
    got = parse_node_time(raw)
    assert got is None or (math.isfinite(got) and got >= 0)


def test_node_time_value_formats_milliseconds() -> None:
    assert node_time_value(1.0, now=1.0125) == "12.500"
    assert node_time_value(2.0, now=1.0) == "0.000"  # (never negative)
    assert parse_node_time(node_time_value(1.0, now=3.0)) == 2000.0
