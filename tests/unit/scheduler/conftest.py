from __future__ import annotations

import pytest

from llmfabric.scheduler.standin import AnalyticStandIn


@pytest.fixture
def perf() -> AnalyticStandIn:
    """The analytic stand-in (not the simulator): fast, deterministic estimates."""
    return AnalyticStandIn()
