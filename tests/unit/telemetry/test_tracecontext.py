"""W3C traceparent: valid headers parse and round-trip; anything else (malformed, oversized,
forbidden values) is refused so a new trace starts. The node's reported time
(X-Fabric-Node-Time) is a small finite decimal or dropped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.telemetry.node_hop import node_time_value, parse_node_time
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
