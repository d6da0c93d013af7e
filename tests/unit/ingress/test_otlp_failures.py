"""A collector that is down costs the ingress a counted drop per batch and a log line at the
1st, 2nd, 4th... failed post: with a post per batch of finished requests, a warning each
time would flood the log while the collector is away. Its counts are on the ingress's
/metrics."""

from __future__ import annotations

import logging
import re

import pytest

from llmfabric.net.ports import free_port
from llmfabric.telemetry.otlp import OtlpExporter

pytestmark = pytest.mark.unit


async def test_failed_posts_are_counted_and_logged_without_a_flood(
        caplog: pytest.LogCaptureFixture) -> None:
    exporter = OtlpExporter(f"http://127.0.0.1:{free_port()}/v1/traces", batch=1,
                            timeout_s=2.0)
    trace = {"trace_id": "0" * 32, "started_at": 1.0, "spans": []}
    try:
        with caplog.at_level(logging.WARNING, logger="llmfabric.telemetry.otlp"):
            for _ in range(5):
                exporter._queue.append(trace)
                await exporter.flush()
    finally:
        await exporter.aclose()
    assert exporter.failed_posts == 5 and exporter.dropped == 5 and exporter.exported == 0
    logged = [r for r in caplog.records if "OTLP export" in r.getMessage()]
    assert len(logged) == 3  # the 1st, 2nd and 4th
    assert "5 failed post(s)" not in logged[-1].getMessage()
    assert "4 failed post(s) so far" in logged[-1].getMessage()
    assert "ClientConnectorError" in logged[0].getMessage()  # (refused: nothing listens)


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_the_exporter_s_counts_are_on_the_ingress_s_metrics() -> None:
    from llmfabric.ingress import IngressConfig, StaticCandidateSource
    from llmfabric.ingress.app import Ingress
    from llmfabric.tenancy.attach import attach_tenancy

    class NoForwarder:
        enforces_timeouts = True

        async def aclose(self) -> None:
            return None

    ing = Ingress(IngressConfig(keep_traces=10, auth_enabled=False), StaticCandidateSource([]),
                  NoForwarder())  # type: ignore[arg-type]
    text = ing.metrics.render().decode()
    assert _sample(text, "llmfabric_ingress_otlp_failed_posts_total") is None  # (no exporter)
    parts = await attach_tenancy(ing, None, env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"})
    exporter = parts.exporter
    assert exporter is not None
    exporter.timeout_s = 2.0
    trace = {"trace_id": "0" * 32, "started_at": 1.0, "spans": []}
    try:
        for _ in range(2):
            exporter._queue.append(trace)
            await exporter.flush()
        text = ing.metrics.render().decode()
    finally:
        await parts.aclose()
    assert re.search(r"# TYPE llmfabric_ingress_otlp_failed_posts(_total)? counter", text)
    assert _sample(text, "llmfabric_ingress_otlp_failed_posts_total") == 2
    assert _sample(text, "llmfabric_ingress_otlp_dropped_traces_total") == 2
    assert _sample(text, "llmfabric_ingress_otlp_exported_traces_total") == 0
