"""Prometheus metrics of one ingress, in its own CollectorRegistry (never the global one)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)


class IngressMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "llmfabric_ingress_requests", "Requests by model and HTTP status",
            ("model", "status"), registry=r,
        )
        self.e2e = Histogram(
            "llmfabric_ingress_e2e_seconds", "End-to-end request latency", ("model",),
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "llmfabric_ingress_ttft_seconds", "Time to the first streamed byte", ("model",),
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.retries = Counter(
            "llmfabric_ingress_retries", "Attempts retried on another candidate", ("model",),
            registry=r,
        )
        self.routed = Counter(
            "llmfabric_ingress_routed", "Attempts routed to each node", ("node",), registry=r,
        )
        self.failed_attempts = Counter(
            "llmfabric_ingress_failed_attempts", "Attempts that failed, per node", ("node",),
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    # Label lookups are cached: prometheus_client's .labels() takes a lock and builds a tuple.
    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    def observe_request(self, model: str, status: int, e2e_s: float) -> None:
        self._child(self.requests, model, str(status)).inc()
        if status < 400:
            self._child(self.e2e, model).observe(e2e_s)

    def observe_ttft(self, model: str, seconds: float) -> None:
        self._child(self.ttft, model).observe(seconds)

    def observe_routed(self, node: str) -> None:
        self._child(self.routed, node).inc()

    def observe_failed_attempt(self, node: str, model: str, retried: bool) -> None:
        self._child(self.failed_attempts, node).inc()
        if retried:
            self._child(self.retries, model).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def metrics_handler(metrics: IngressMetrics) -> Any:
    """An aiohttp handler serving the metrics (mount it at /metrics)."""

    async def handler(_: web.Request) -> web.Response:
        resp = web.Response(body=metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    return handler
