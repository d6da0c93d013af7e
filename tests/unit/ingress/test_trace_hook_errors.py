"""A trace hook that raises (the node's demand meter, `--record-trace`'s recorder) never
fails the request it was called for, and is not silent either: each failure is counted
(`llmfabric_ingress_trace_hook_errors_total`) and logged, the 1st, 2nd, 4th, 8th...
(with its traceback the first time), so a hook broken on every request does not flood the
log. The hook's errors were dropped unseen before."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from llmfabric.ingress.config import TraceEvent

from .test_model_fallbacks import ask, cand, ingress

pytestmark = pytest.mark.unit


async def test_a_raising_trace_hook_is_counted_and_logged_never_failing_a_request(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[TraceEvent] = []

    def broken(event: TraceEvent) -> None:
        seen.append(event)
        raise KeyError("demand meter bug")

    ing, _, _ = ingress([cand("s1", "small")], trace_hook=broken)
    caplog.set_level(logging.ERROR, logger="llmfabric")
    for _ in range(5):
        reply = await ask(ing, {"model": "small"})
        assert reply is not None and reply.status == 200
    assert len(seen) == 5 and ing.metrics.hook_errors == 5
    logged = [r for r in caplog.records if "trace hook failed" in r.getMessage()]
    assert [r.getMessage().split("; ")[-1].split(" ")[0] for r in logged] == ["1", "2", "4"]
    assert "KeyError('demand meter bug')" in logged[0].getMessage()
    assert logged[0].exc_info and not logged[1].exc_info  # (the traceback once)
    text = generate_latest(ing.metrics.registry).decode()
    assert "llmfabric_ingress_trace_hook_errors_total 5.0" in text
