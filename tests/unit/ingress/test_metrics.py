"""IngressMetrics: plain counters on the request path, exposed as Prometheus families."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmfabric.ingress.metrics import IngressMetrics


def samples(m: IngressMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_and_histograms_render_as_prometheus_text() -> None:
    m = IngressMetrics()
    m.observe_request("m", 200, 0.005)  # exactly on a bucket bound: counted in le=0.005
    m.observe_request("m", 200, 0.3)
    m.observe_request("m", 503, 0.0)  # errors count, but stay out of the latency histogram
    m.observe_ttft("m", 0.02)
    m.observe_routed("n1")
    m.observe_routed("n1")
    m.observe_failed_attempt("n1", "m", retried=True)
    m.observe_failed_attempt("n2", "m", retried=False)
    s = samples(m)
    assert s[("llmfabric_ingress_requests_total", (("model", "m"), ("status", "200")))] == 2
    assert s[("llmfabric_ingress_requests_total", (("model", "m"), ("status", "503")))] == 1
    e2e = "llmfabric_ingress_e2e_seconds"
    assert s[(e2e + "_bucket", (("le", "0.005"), ("model", "m")))] == 1
    assert s[(e2e + "_bucket", (("le", "0.25"), ("model", "m")))] == 1
    assert s[(e2e + "_bucket", (("le", "0.5"), ("model", "m")))] == 2
    assert s[(e2e + "_bucket", (("le", "+Inf"), ("model", "m")))] == 2
    assert s[(e2e + "_count", (("model", "m"),))] == 2
    assert abs(s[(e2e + "_sum", (("model", "m"),))] - 0.305) < 1e-9
    assert s[("llmfabric_ingress_ttft_seconds_count", (("model", "m"),))] == 1
    assert s[("llmfabric_ingress_routed_total", (("node", "n1"),))] == 2
    assert s[("llmfabric_ingress_failed_attempts_total", (("node", "n2"),))] == 1
    assert s[("llmfabric_ingress_retries_total", (("model", "m"),))] == 1


def test_two_instances_have_separate_registries() -> None:
    a, b = IngressMetrics(), IngressMetrics()
    a.observe_routed("x")
    assert ("llmfabric_ingress_routed_total", (("node", "x"),)) in samples(a)
    assert ("llmfabric_ingress_routed_total", (("node", "x"),)) not in samples(b)


@pytest.mark.hostile
def test_label_cardinality_is_bounded_whatever_names_clients_send() -> None:
    from llmfabric.ingress.metrics import MAX_MODEL_LABELS, MAX_NODE_LABELS, OTHER

    m = IngressMetrics()
    m.known_model = lambda name: name in {"llama", "qwen"}
    for i in range(5000):
        m.observe_error(f"no-such-model-{i}", 404, "model_not_found")
    m.observe_request("llama", 200, 0.1)
    assert {model for model, _ in m.requests} == {OTHER, "llama"}
    assert m.requests[(OTHER, "404")] == 5000
    m.known_model = None  # even if every name were known, the number of labels is capped
    for i in range(5000):
        m.observe_request(f"m{i}", 200, 0.1)
        m.observe_routed(f"node-{i}")
    assert len({model for model, _ in m.requests}) <= MAX_MODEL_LABELS + 1
    assert len(m.e2e) <= MAX_MODEL_LABELS + 1 and len(m.routed) <= MAX_NODE_LABELS + 1


@pytest.mark.hostile
def test_model_fallbacks_are_counted_by_bounded_model_pairs() -> None:
    from llmfabric.ingress.metrics import MAX_FALLBACK_PAIRS, OTHER

    m = IngressMetrics()
    m.known_model = lambda name: name in {"big", "small"}
    m.observe_fallback("big", "small")
    m.observe_fallback("no-such-model", "small")
    s = samples(m)
    name = "llmfabric_ingress_model_fallbacks_total"
    assert s[(name, (("from", "big"), ("to", "small")))] == 1
    assert s[(name, (("from", OTHER), ("to", "small")))] == 1
    m.known_model = None  # known names, but never more pairs than the cap
    for i in range(2000):
        m.observe_fallback(f"a{i}", f"b{i}")
    assert len(m.fallbacks) <= MAX_FALLBACK_PAIRS + 1
    assert sum(m.fallbacks.values()) == 2002
