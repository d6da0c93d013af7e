"""deploy/grafana/llmfabric.json parses, and every query names only metrics an ingress node
exports (so a renamed metric cannot silently blank a panel); the exported names follow the
Prometheus conventions (prefix, units, _total on counters, bounded labels)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmfabric.agent.engine_metrics import EngineLoad
from llmfabric.agent.kv_events_config import KvEventsEndpoint
from llmfabric.gossip.stats import AgentStats
from llmfabric.ingress.metrics import MAX_OWNER_LABELS, OTHER, IngressMetrics
from llmfabric.net.stats import NetStats
from llmfabric.node.engine_link import KvEventsLink
from llmfabric.node.serve.metrics import NodeMetrics
from llmfabric.registry.records import LoadHints
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.telemetry.otlp import OtlpExporter
from llmfabric.tenancy.attach import export_otlp_counts

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "llmfabric.json"
_METRIC = re.compile(r"\bllmfabric_[a-z0-9_]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "gauge": ("",)}
# Labels whose values we bound (known models/nodes/owners, else "other") or that are enums.
_BOUNDED_LABELS = {"model", "status", "code", "node", "owner", "kind", "reason", "state",
                   "direction", "path", "event", "le",
                   "from", "to"}  # (model fallbacks: two model labels, pairs capped)


def _families() -> dict[str, str]:
    """Every family an ingress node exports, name -> type."""
    im = IngressMetrics()
    im.observe_request("m", 200, 0.1)
    im.observe_ttft("m", 0.05)
    im.observe_usage("m", "alice", 10, 5)
    im.observe_tpot("m", 0.2, 5)
    im.observe_fallback("m", "m2")
    nm = NodeMetrics()
    nm._counters.gossip = AgentStats()
    nm._counters.net = NetStats()
    nm.watch_dataplane({"bad_mac": 0}, {"https": 0})
    nm.observe_engine(EngineLoad(1, 0, 0.5, 0.25, 100.0, 400.0))
    link = KvEventsLink(KvEventsEndpoint("tcp://127.0.0.1:5557"), HeldPrefixes(lambda: 0.0))
    nm.watch_kv_events(lambda: link)
    node_exporter = OtlpExporter("http://127.0.0.1:9/v1/traces")
    nm.watch_otlp(lambda: node_exporter)
    export_otlp_counts(SimpleNamespace(metrics=im),  # type: ignore[arg-type]
                       OtlpExporter("http://127.0.0.1:9/v1/traces"))
    out: dict[str, str] = {}
    for reg in (im.registry, nm.registry):
        for fam in text_string_to_metric_families(generate_latest(reg).decode()):
            out[fam.name] = fam.type
    return out


def _exported_series() -> set[str]:
    return {f + suffix for f, kind in _families().items() for suffix in _SUFFIXES[kind]}


def test_dashboard_parses_and_every_query_names_exported_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30
    exported = _exported_series()
    panels = doc["panels"]
    assert len(panels) >= 10
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids)
    queried: set[str] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(_METRIC.findall(target["expr"]))
            assert names, f"{panel['title']}: {target['expr']}"
            unknown = names - exported
            assert not unknown, f"{panel['title']} queries unexported {sorted(unknown)}"
            assert target["expr"].count("(") == target["expr"].count(")")
            queried |= names
    for var in doc["templating"]["list"]:
        assert set(_METRIC.findall(var.get("query", ""))) <= exported
    # the panels people ask for are there
    for wanted in ("llmfabric_ingress_ttft_seconds_bucket",
                   "llmfabric_ingress_time_per_output_token_seconds_bucket",
                   "llmfabric_ingress_queue_seconds_bucket", "llmfabric_ingress_tokens_total",
                   "llmfabric_engine_prefix_cache_hits_total",
                   "llmfabric_ingress_node_prefix_cache_hit_ratio"):
        assert wanted in queried


def test_a_query_of_an_unknown_metric_would_be_caught() -> None:
    assert "llmfabric_ingress_ttft_bucket" not in _exported_series()


def test_metric_names_follow_prometheus_conventions() -> None:
    fams = _families()
    assert fams
    for name, kind in fams.items():
        assert re.fullmatch(r"llmfabric_[a-z][a-z0-9_]*[a-z0-9]", name), name
        if kind == "histogram":
            assert name.endswith("_seconds"), f"{name}: a histogram names its unit"
        if kind == "gauge":
            assert not name.endswith("_total"), name


def test_labels_are_bounded() -> None:
    im = IngressMetrics()
    for i in range(MAX_OWNER_LABELS + 50):
        im.observe_usage("m", f"owner-{i}", 1, 1)
    owners = {o for (_, o, _) in im.tokens}
    assert len(owners) <= MAX_OWNER_LABELS + 1 and OTHER in owners
    text = im.render().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert set(s.labels) <= _BOUNDED_LABELS, (fam.name, s.labels)


def test_time_per_output_token_and_tokens_per_owner() -> None:
    im = IngressMetrics()
    im.observe_tpot("m", 0.2, 5)  # 4 tokens after the first in 0.2 s
    im.observe_tpot("m", 0.2, 1)  # one token: no inter-token time
    im.observe_usage("m", "alice", 10, 5)
    im.observe_usage("m", "alice", 0, 3)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(im.render().decode()) for s in fam.samples}
    assert got[("llmfabric_ingress_time_per_output_token_seconds_count", (("model", "m"),))] == 1
    assert got[("llmfabric_ingress_time_per_output_token_seconds_sum", (("model", "m"),))] == (
        pytest.approx(0.05))
    assert got[("llmfabric_ingress_tokens_total",
                (("kind", "completion"), ("model", "m"), ("owner", "alice")))] == 8
    assert ("llmfabric_ingress_tokens_total",
            (("kind", "prompt"), ("model", "m"), ("owner", "alice"))) in got


def test_the_cache_hit_estimate_is_exported_by_node_and_ingress() -> None:
    """The engine's prefix-cache counters and recent rate on the node; each serving node's
    gossiped rate (and their mean) on the ingress, read from the candidates at scrape time."""
    nm = NodeMetrics()
    nm.observe_engine(EngineLoad(2, 1, 0.5, 0.25, 100.0, 400.0))

    def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    got = samples(generate_latest(nm.registry).decode())
    assert got[("llmfabric_engine_prefix_cache_hits_total", ())] == 100
    assert got[("llmfabric_engine_prefix_cache_queries_total", ())] == 400
    assert got[("llmfabric_engine_prefix_cache_hit_ratio", ())] == 0.25
    assert got[("llmfabric_engine_requests_waiting", ())] == 1
    nm.observe_engine(EngineLoad(2))  # an engine that says nothing of its cache
    got = samples(generate_latest(nm.registry).decode())
    assert not any(name.startswith("llmfabric_engine_prefix") for name, _ in got)

    im = IngressMetrics()
    load = {"a": LoadHints(prefix_hit_rate=0.5), "b": LoadHints(prefix_hit_rate=0.1)}
    im.candidates = lambda: [_Cand(n, h) for n, h in load.items()] + [_Cand("a", load["a"])]
    got = samples(im.render().decode())
    assert got[("llmfabric_ingress_node_prefix_cache_hit_ratio", (("node", "a"),))] == 0.5
    assert got[("llmfabric_ingress_node_prefix_cache_hit_ratio", (("node", "b"),))] == 0.1
    assert got[("llmfabric_ingress_prefix_cache_hit_ratio", ())] == pytest.approx(0.3)


@dataclass(frozen=True)
class _Cand:
    session_id: str
    load: LoadHints
