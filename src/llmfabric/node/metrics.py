"""Prometheus metrics of a node: gossip, transport and request counters, read on scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from llmfabric.agent import InflightTracker
from llmfabric.gossip.agent import GossipAgent
from llmfabric.net import TlsTransport
from llmfabric.registry.records import Lifecycle


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registries: list[CollectorRegistry] = [self.registry]
        r = self.registry
        self.nodes = Gauge("llmfabric_registry_nodes", "Sessions in the replica by state",
                           ["state"], registry=r)
        self.suspected = Gauge("llmfabric_registry_suspected", "Suspected sessions", registry=r)
        self.gossip_bytes = Gauge("llmfabric_gossip_bytes", "Gossip bytes", ["direction"],
                                  registry=r)
        self.gossip_dropped = Gauge("llmfabric_gossip_dropped", "Dropped gossip messages",
                                    ["reason"], registry=r)
        self.gossip_rejected = Gauge("llmfabric_gossip_rejected", "Rejected registry items",
                                     ["reason"], registry=r)
        self.net_bytes = Gauge("llmfabric_net_bytes", "Transport bytes", ["direction"],
                               registry=r)
        self.net_dropped = Gauge("llmfabric_net_dropped", "Transport drops", ["reason"],
                                 registry=r)
        self.handshakes_refused = Gauge("llmfabric_net_handshakes_refused",
                                        "Refused handshakes", ["reason"], registry=r)
        self.inflight = Gauge("llmfabric_inflight_requests", "Requests being served",
                              registry=r)

    def add_registry(self, registry: CollectorRegistry) -> None:
        self.registries.append(registry)

    def refresh(
        self, agent: GossipAgent, transport: TlsTransport, tracker: InflightTracker
    ) -> None:
        views = agent.nodes.all()
        for state in Lifecycle:
            self.nodes.labels(state.name).set(sum(1 for v in views if v.state is state))
        self.suspected.set(sum(1 for v in views if v.suspected))
        stats = agent.stats
        self.gossip_bytes.labels("out").set(stats.bytes_out)
        self.gossip_bytes.labels("in").set(stats.bytes_in)
        for reason, n in stats.dropped.items():
            self.gossip_dropped.labels(reason).set(n)
        for reason, n in stats.rejected.items():
            self.gossip_rejected.labels(reason).set(n)
        net = transport.stats
        self.net_bytes.labels("out").set(net.bytes_sent)
        self.net_bytes.labels("in").set(net.bytes_received)
        for reason, n in net.dropped.items():
            self.net_dropped.labels(reason).set(n)
        for reason, n in net.handshakes_refused.items():
            self.handshakes_refused.labels(reason).set(n)
        self.inflight.set(tracker.inflight)
