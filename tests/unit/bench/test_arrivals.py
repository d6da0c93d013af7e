"""Arrival processes: bounded, ordered, and shaped as specified."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.bench import BenchConfigError, Gamma, OnOff, Poisson, Replay


@given(
    st.sampled_from(["poisson", "gamma", "onoff"]),
    st.integers(1, 300),
    st.floats(0.5, 60),
    st.integers(0, 10_000),
)
def test_offsets_are_bounded_sorted_and_non_negative(
    kind: str, max_requests: int, max_duration: float, seed: int
) -> None:
    process = {"poisson": Poisson(7.0), "gamma": Gamma(7.0, 0.5), "onoff": OnOff()}[kind]
    offsets = process.offsets(random.Random(seed), max_requests, max_duration)
    assert len(offsets) <= max_requests
    assert offsets == sorted(offsets)
    assert all(0 <= t < max_duration for t in offsets)


def test_poisson_rate_and_gamma_burstiness() -> None:
    gaps = _gaps(Poisson(10.0).offsets(random.Random(1), 5000, 1e9))
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.1)
    bursty = _gaps(Gamma(10.0, 0.25).offsets(random.Random(1), 5000, 1e9))
    assert statistics.mean(bursty) == pytest.approx(0.1, rel=0.1)
    # gamma with shape k has coefficient of variation 1 / sqrt(k) = 2
    assert statistics.stdev(bursty) / statistics.mean(bursty) == pytest.approx(2.0, rel=0.15)


def test_onoff_alternates_low_and_burst_phases() -> None:
    process = OnOff(low_rate=(2, 5), high_rate=(10, 30), low_s=20, high_s=10)
    rng_phases = random.Random(3)
    phases = process.phases(rng_phases, 300)
    assert [round(p[0]) for p in phases[:4]] == [0, 20, 30, 50]
    for i, (_, _, rate) in enumerate(phases):
        lo, hi = (2, 5) if i % 2 == 0 else (10, 30)
        assert lo <= rate <= hi
    offsets = process.offsets(random.Random(3), 100_000, 300)
    low = sum(1 for t in offsets if t % 30 < 20) / (10 * 20)
    high = sum(1 for t in offsets if t % 30 >= 20) / (10 * 10)
    assert 2 * 0.8 <= low <= 5 * 1.2 and 10 * 0.8 <= high <= 30 * 1.2


def test_replay_scales_trace_time() -> None:
    replay = Replay([100.0, 101.0, 103.0, 110.0], time_scale=0.5)
    assert replay.offsets(random.Random(0), 10, 1e9) == [0.0, 0.5, 1.5, 5.0]
    assert replay.offsets(random.Random(0), 2, 1e9) == [0.0, 0.5]
    assert replay.offsets(random.Random(0), 10, 2.0) == [0.0, 0.5, 1.5]


def test_unbounded_or_bad_parameters_are_refused() -> None:
    with pytest.raises(BenchConfigError):
        Poisson(0.0)
    with pytest.raises(BenchConfigError):
        OnOff(low_rate=(5, 2))
    with pytest.raises(BenchConfigError, match="bound"):
        Poisson(1.0).offsets(random.Random(0), 0, 10)
    with pytest.raises(BenchConfigError, match="bound"):
        Poisson(1.0).offsets(random.Random(0), 10, float("inf") * 0)


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
