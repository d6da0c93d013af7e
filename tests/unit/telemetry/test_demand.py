"""The ingress's demand meter: sliding-window rates and token means on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.registry.records import ModelDemand
from llmfabric.telemetry.demand import MAX_PUBLISHED_MODELS, DemandMeter, moved
from llmfabric.testing.fake_clock import FakeClock


async def test_rate_and_means_over_the_window() -> None:
    clock = FakeClock()
    meter = DemandMeter(clock, window_s=60, bucket_s=10)
    for i in range(120):  # 2 req/s for 60 s; usage on every other request
        meter.record("llama", *((100 + i % 3, 20) if i % 2 == 0 else (None, None)))
        await clock.advance(0.5)
    (d,) = meter.snapshot()
    assert d.model == "llama"
    assert d.rate == pytest.approx(2.0, rel=0.05)
    assert d.mean_in == pytest.approx(101.0, abs=0.5) and d.mean_out == 20.0


async def test_a_young_meter_reports_its_rate_over_the_time_elapsed() -> None:
    clock = FakeClock()
    meter = DemandMeter(clock, window_s=300, bucket_s=10)
    for _ in range(30):  # 1 req/s for 30 s, not 30 requests / 300 s
        meter.record("m", 10, 5)
        await clock.advance(1.0)
    assert meter.snapshot()[0].rate == pytest.approx(1.0, rel=0.05)


async def test_old_buckets_fall_out_and_idle_models_disappear() -> None:
    clock = FakeClock()
    meter = DemandMeter(clock, window_s=60, bucket_s=10)
    for _ in range(60):
        meter.record("old", 10, 5)
        await clock.advance(1.0)
    await clock.advance(30.0)
    meter.record("new", None, None)
    snap = {d.model: d for d in meter.snapshot()}
    # kept buckets cover [40 s, 90 s): 20 of the old requests fall in it
    assert snap["old"].rate == pytest.approx(20 / 50)
    assert snap["new"].mean_in == 0.0 and snap["new"].mean_out == 0.0  # no usage seen
    await clock.advance(61.0)
    assert [d.model for d in meter.snapshot()] == []


async def test_snapshot_keeps_the_busiest_models_first() -> None:
    clock = FakeClock()
    meter = DemandMeter(clock)
    for i in range(MAX_PUBLISHED_MODELS + 5):
        for _ in range(i + 1):
            meter.record(f"m{i}", 1, 1)
    snap = meter.snapshot()
    assert len(snap) == MAX_PUBLISHED_MODELS
    assert snap[0].model == f"m{MAX_PUBLISHED_MODELS + 4}"
    assert [d.rate for d in snap] == sorted((d.rate for d in snap), reverse=True)


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError):
        DemandMeter(FakeClock(), window_s=5, bucket_s=10)


def test_moved_ignores_noise_and_sees_real_change() -> None:
    a = (ModelDemand("m", 2.0, 500.0, 100.0),)
    assert not moved(a, (ModelDemand("m", 2.1, 520.0, 95.0),))
    assert moved(a, (ModelDemand("m", 2.5, 500.0, 100.0),))
    assert moved(a, (ModelDemand("m", 2.0, 500.0, 100.0), ModelDemand("n", 0.01, 0, 0)))
    assert moved(a, ())
    assert not moved((), ())


demands = st.lists(
    st.builds(ModelDemand, st.sampled_from(["a", "b", "c"]),
              st.floats(0, 100), st.floats(0, 1e4), st.floats(0, 1e4)),
    max_size=3, unique_by=lambda d: d.model,
).map(tuple)


@given(demands)
def test_an_unchanged_snapshot_never_counts_as_moved(d: tuple[ModelDemand, ...]) -> None:
    assert not moved(d, d)
