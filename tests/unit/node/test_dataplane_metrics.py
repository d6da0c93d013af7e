import pytest
from prometheus_client import generate_latest

from llmfabric.node.serve.metrics import NodeMetrics

pytestmark = pytest.mark.unit


def test_dataplane_refusals_are_exported_live() -> None:
    metrics = NodeMetrics()
    refused: dict[str, int] = {}
    served = {"https": 0, "sealed": 0}
    metrics.watch_dataplane(refused, served)
    served["https"] += 3
    refused["replayed"] = 2
    refused["bad_mac"] = 1
    text = generate_latest(metrics.registry).decode()
    assert 'llmfabric_dataplane_refused_total{reason="replayed"} 2.0' in text
    assert 'llmfabric_dataplane_refused_total{reason="bad_mac"} 1.0' in text
    assert 'llmfabric_dataplane_requests_total{path="https"} 3.0' in text
