"""Prometheus metrics of a node: gossip, transport and request counters, read on scrape.

Counts (bytes, drops, refusals) are exported as Prometheus counters (`*_total`), read from
objects that live as long as the node: the transport's `NetStats` and the gossip
`AgentStats` the node hands to the agent of every session it runs (a node evicted by the
fabric rejoins with a new agent; its counters must not reset, or `rate()` would break).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmfabric.agent import InflightTracker
from llmfabric.agent.engine_metrics import EngineLoad
from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.stats import AgentStats
from llmfabric.net import NetStats, TlsTransport
from llmfabric.net.source_slots import SourceSlots
from llmfabric.node.engine_link import KvEventsLink
from llmfabric.registry.records import Lifecycle
from llmfabric.telemetry.otlp import OtlpExporter


def _family(
    name: str, doc: str, label: str, values: Mapping[str, int | float]
) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        fam.add_metric([key], value)
    return fam


class _Counters(Collector):
    """Counter families read from the node's long-lived stats objects at scrape time."""

    def __init__(self) -> None:
        self.gossip: AgentStats | None = None
        self.net: NetStats | None = None
        self.dataplane_refused: Mapping[str, int] | None = None
        self.dataplane_served: Mapping[str, int] | None = None
        self.task_failures: Mapping[str, int] | None = None
        self.gossip_loops: AgentStats | None = None
        self.more_failures: dict[str, Mapping[str, int]] = {}  # prefix -> failures by kind
        self.engine: EngineLoad | None = None  # the engine's last scraped load
        # The engine's KV-cache event subscription now (None: no engine, or no events).
        self.kv_events: Callable[[], KvEventsLink | None] | None = None
        # The OTLP exporter of the engine's proxy now (None: no engine, or no export).
        self.otlp: Callable[[], OtlpExporter | None] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.engine is not None:
            yield from _engine_families(self.engine)
        if (link := self.kv_events() if self.kv_events is not None else None) is not None:
            yield from _kv_event_families(link)
        if (exporter := self.otlp() if self.otlp is not None else None) is not None:
            for name, doc, value in (
                ("llmfabric_node_otlp_exported_traces", "Node spans the engine proxy's OTLP "
                 "exporter posted", exporter.exported),
                ("llmfabric_node_otlp_dropped_traces", "Node spans the engine proxy's OTLP "
                 "exporter dropped (its queue full, or their post failed)", exporter.dropped),
                ("llmfabric_node_otlp_failed_posts", "Posts of node spans to the OTLP "
                 "collector that failed", exporter.failed_posts),
            ):
                c = CounterMetricFamily(name, doc)
                c.add_metric((), value)
                yield c
        g, n = self.gossip, self.net
        if self.task_failures is not None:
            failures = dict(self.task_failures)
            if self.gossip_loops is not None:
                failures["gossip"] = self.gossip_loops.loop_errors
            for prefix, more in self.more_failures.items():
                failures.update({f"{prefix}-{kind}": n for kind, n in more.items()})
            yield _family("llmfabric_node_task_failures",
                          "Background task failures (each logged with its traceback; the "
                          "supervisor restarts the task or takes the node down)", "task",
                          failures)
        if g is not None:
            yield _family("llmfabric_gossip_bytes", "Gossip bytes", "direction",
                          {"out": g.bytes_out, "in": g.bytes_in})
            yield _family("llmfabric_gossip_dropped", "Dropped gossip messages", "reason",
                          g.dropped)
            yield _family("llmfabric_gossip_rejected",
                          "Refused registry items (forged, invalid, stale, tombstoned, "
                          "future or bad timestamps, not admitted)", "reason", g.rejected)
            yield _family("llmfabric_membership_events", "SWIM decisions of this node",
                          "event", {"suspicion_raised": g.suspicions_raised,
                                    "eviction_issued": g.evictions_issued,
                                    "refutation": g.refutations,
                                    "eviction_refuted": g.evictions_refuted})
        if n is not None:
            yield _family("llmfabric_net_bytes", "Transport bytes (frames, TLS excluded)",
                          "direction", {"out": n.bytes_sent, "in": n.bytes_received})
            yield _family("llmfabric_net_dropped", "Transport drops", "reason", n.dropped)
            yield _family("llmfabric_net_handshakes_refused", "Refused handshakes", "reason",
                          n.handshakes_refused)
            yield _family("llmfabric_net_errors", "Transport failures caught and logged "
                          "(handlers, callbacks, background tasks)", "where", n.errors)
        if self.dataplane_refused is not None:
            yield _family("llmfabric_dataplane_refused",
                          "Forwarded requests refused by this provider's data plane "
                          "(replayed, bad_mac, expired, unknown_session, ...)", "reason",
                          self.dataplane_refused)
        if self.dataplane_served is not None:
            yield _family("llmfabric_dataplane_requests",
                          "Authorized forwarded requests this provider served, by path "
                          "(https: direct, sealed: peer network / relays)", "path",
                          self.dataplane_served)


def _kv_event_families(link: KvEventsLink) -> Iterator[Metric]:
    """What the node made of its engine's KV-cache events (node/engine_link.py):
    messages received, and dropped by reason (socket, malformed, apply: counted and logged
    a few times only), sequence gaps. They count from the engine's start."""
    for name, doc, value in (
        ("llmfabric_kv_events_received", "KV-cache event messages received from the engine",
         link.received),
        ("llmfabric_kv_events_gaps", "Gaps in the engine's KV-cache event sequence numbers "
         "(messages missed: the held-prefix sketch may be stale)", link.gaps),
    ):
        c = CounterMetricFamily(name, doc)
        c.add_metric((), value)
        yield c
    yield _family("llmfabric_kv_events_dropped", "KV-cache event messages dropped, by reason "
                  "(socket: a receive failed; malformed; apply: applying them failed)",
                  "reason", {r: link.dropped.get(r, 0) for r in ("socket", "malformed",
                                                                  "apply")})


def _engine_families(e: EngineLoad) -> Iterator[Metric]:
    """The engine's own load and prefix-cache hits (agent/engine_metrics.py), under names that
    do not depend on the engine kind."""
    for name, doc, value in (
        ("llmfabric_engine_requests_running", "Requests the engine is running", e.running),
        ("llmfabric_engine_requests_waiting", "Requests waiting in the engine's queue",
         e.waiting),
        ("llmfabric_engine_kv_cache_usage_ratio", "Fraction of the engine's KV cache in use",
         e.kv_usage),
    ):
        g = GaugeMetricFamily(name, doc)
        g.add_metric((), value)
        yield g
    if e.prefix_hit_rate is not None:
        g = GaugeMetricFamily("llmfabric_engine_prefix_cache_hit_ratio",
                              "Recent prefix-cache hit rate of the engine (0..1)")
        g.add_metric((), e.prefix_hit_rate)
        yield g
    if e.prefix_hits is not None and e.prefix_queries is not None:
        for name, doc, value in (
            ("llmfabric_engine_prefix_cache_hits", "Prompt tokens the engine served from its "
             "prefix cache", e.prefix_hits),
            ("llmfabric_engine_prefix_cache_queries", "Prompt tokens the engine looked up in "
             "its prefix cache", e.prefix_queries),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric((), value)
            yield c


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registries: list[CollectorRegistry] = [self.registry]
        r = self.registry
        self.nodes = Gauge("llmfabric_registry_nodes", "Sessions in the replica by state",
                           ["state"], registry=r)
        self.suspected = Gauge("llmfabric_registry_suspected", "Suspected sessions", registry=r)
        self.inflight = Gauge("llmfabric_inflight_requests", "Requests being served",
                              registry=r)
        # how full the caps on unfinished handshakes are (a flood in progress shows here)
        self.handshaking = Gauge(
            "llmfabric_net_handshakes_in_flight",
            "Inbound peer connections that have not finished their handshakes (TLS, then "
            "the peer handshake); capped by max_handshakes", registry=r)
        self.dataplane_unproven = Gauge(
            "llmfabric_dataplane_unproven_connections",
            "Data-plane HTTPS connections before their first authorized request (TLS "
            "included); capped like the peer listener's handshakes", registry=r)
        self._dataplane_slots: SourceSlots | None = None
        self._counters = _Counters()
        r.register(self._counters)

    def watch_dataplane(self, refused: Mapping[str, int],
                        served: Mapping[str, int] | None = None,
                        unproven: SourceSlots | None = None) -> None:
        """Export the data plane's counts (dicts the server keeps updating) and its
        connections not yet proven (read at each refresh)."""
        self._counters.dataplane_refused = refused
        self._counters.dataplane_served = served
        self._dataplane_slots = unproven

    def watch_tasks(self, failures: Mapping[str, int], gossip: AgentStats) -> None:
        """Export the supervisor's task failures (and the gossip loops' own restarts)."""
        self._counters.task_failures = failures
        self._counters.gossip_loops = gossip

    def watch_failures(self, prefix: str, failures: Mapping[str, int]) -> None:
        """Export another part's background failures as tasks `prefix-kind`."""
        self._counters.more_failures[prefix] = failures

    def watch_kv_events(self, link: Callable[[], KvEventsLink | None]) -> None:
        """Export the KV-cache event counts of the engine's subscription (`link`: the one
        now, read at each scrape: an engine restart makes a new one, counting from 0)."""
        self._counters.kv_events = link

    def watch_otlp(self, exporter: Callable[[], OtlpExporter | None]) -> None:
        """Export the counts of the engine proxy's OTLP exporter (`exporter`: the one now,
        read at each scrape; an engine restart makes a new one, counting from 0)."""
        self._counters.otlp = exporter

    def observe_engine(self, load: EngineLoad | None) -> None:
        """The engine's load as last scraped (None: it told nothing; the gauges go away)."""
        self._counters.engine = load

    def add_registry(self, registry: CollectorRegistry) -> None:
        self.registries.append(registry)

    def refresh(
        self, agent: GossipAgent, transport: TlsTransport, tracker: InflightTracker
    ) -> None:
        views = agent.nodes.all()
        for state in Lifecycle:
            self.nodes.labels(state.name).set(sum(1 for v in views if v.state is state))
        self.suspected.set(sum(1 for v in views if v.suspected))
        self._counters.gossip = agent.stats
        self._counters.net = transport.stats
        self.handshaking.set(transport.handshaking.total)
        if self._dataplane_slots is not None:
            self.dataplane_unproven.set(self._dataplane_slots.total)
        self.inflight.set(tracker.inflight)
