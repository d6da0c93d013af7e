"""Laws of the characterization on arbitrary traces (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.traces import TraceRecord
from llmfabric.traces.analysis import TraceAnalyzer

records = st.lists(
    st.builds(
        TraceRecord,
        timestamp=st.floats(0, 10_000),
        model=st.sampled_from(["a", "b", "c-r1"]),
        input_tokens=st.integers(1, 5000),
        output_tokens=st.integers(0, 2000),
        hash_ids=st.one_of(
            st.none(), st.lists(st.integers(0, 20), min_size=1, max_size=8).map(tuple)
        ),
        latency_s=st.one_of(st.none(), st.floats(0.01, 100)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(records)
def test_characterization_laws(recs: list[TraceRecord]) -> None:
    recs = sorted(recs, key=lambda r: r.timestamp)
    analyzer = TraceAnalyzer()
    analyzer.add(recs)
    ch = analyzer.finish()
    assert sum(m["requests"] for m in ch.models.values()) == len(recs)
    assert sum(t["share"] for t in ch.tiers) == pytest.approx(1.0)
    assert [t["tier"] for t in ch.tiers] == sorted(t["tier"] for t in ch.tiers)
    tokens = [t["tokens"] for t in ch.tiers]
    assert tokens == sorted(tokens, reverse=True)
    for m in ch.models.values():
        for key in ("input_tokens", "output_tokens"):
            p = m[key]
            assert p["p50"] <= p["p95"] <= p["p99"]
        if m["burstiness_peak"] is not None:
            assert m["burstiness_peak"] >= 1.0 - 1e-9
        assert m["request_burstiness_peak"] >= 1.0 - 1e-9
        if m["prefix_reuse_ratio"] is not None:
            assert 0.0 <= m["prefix_reuse_ratio"] <= 1.0
    for series in ch.output_ratio.values():
        assert all(0.0 <= r <= 1.0 for _, r in series)
