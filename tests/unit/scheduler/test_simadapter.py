"""SimPerformance against the real simulator (llmfabric.sim): shapes, not numbers."""

from __future__ import annotations

import pytest

from llmfabric.scheduler.errors import SpecError
from llmfabric.scheduler.simadapter import SimPerformance


def test_estimates_follow_load() -> None:
    perf = SimPerformance(horizon_s=30.0, max_requests=600)
    light = perf.estimate("llama-3.1-8b", "H100-SXM", 1, 0.5, 512, 128)
    heavy = perf.estimate("llama-3.1-8b", "H100-SXM", 1, 500.0, 512, 128)
    assert light.feasible and not light.saturated
    assert light.throughput_rps == pytest.approx(0.5)
    assert heavy.saturated and heavy.throughput_rps < 500.0
    assert heavy.mean_e2e_s > light.mean_e2e_s
    # cached: the same question does not run the simulator again
    calls = perf.calls
    perf.estimate("llama-3.1-8b", "H100-SXM", 1, 0.5, 512, 128)
    assert perf.calls == calls


def test_memory_feasibility_and_names() -> None:
    perf = SimPerformance()
    assert not perf.fits("Llama-3.3-70B-Instruct", "A100-80GB", 1, 800, 200)
    assert perf.fits("Llama-3.3-70B-Instruct", "A100-80GB", 4, 800, 200)
    assert perf.params_b("Llama-3.3-70B-Instruct") == pytest.approx(70.6, rel=0.01)
    assert not perf.estimate("Llama-3.3-70B-Instruct", "A100-80GB", 1, 1.0, 800, 200).feasible
    assert perf.gpu("GH200").memory_gb > perf.gpu("A100-80GB").memory_gb
    with pytest.raises(SpecError, match=r"^unknown model 'no-such-model-7b'") as raised:
        perf.params_b("no-such-model-7b")
    assert str(raised.value).count("no-such-model-7b") == 1  # (said once, not wrapped)
