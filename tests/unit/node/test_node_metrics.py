"""Node metrics: drop and refusal counts are Prometheus counters that keep counting across
the agents of successive sessions (a node evicted by the fabric rejoins with a new agent),
and the replica's own refusal reasons are exported."""

from __future__ import annotations

import math
import pathlib
import re
from types import SimpleNamespace

from prometheus_client import generate_latest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.stats import AgentStats
from llmfabric.identity.keys import NodeKey
from llmfabric.net import NetStats
from llmfabric.net.source_slots import SourceSlots
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.node.serve.metrics import NodeMetrics
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.replica import item_parts
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


def _sample(text: str, name: str, label: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {label} not in\n{text}")


def _scrape(metrics: NodeMetrics, agent: GossipAgent, net: NetStats) -> str:
    transport = SimpleNamespace(stats=net, handshaking=SourceSlots(4, 2))
    metrics.refresh(agent, transport, SimpleNamespace(inflight=0))  # type: ignore[arg-type]
    return generate_latest(metrics.registry).decode()


def _refuse_inf_evict(agent: GossipAgent, clock: FakeClock) -> None:
    evil = make_fact(NodeKey.generate(), FactKind.EVICT, agent.session_id, 0, math.inf)
    agent._ingest((item_parts(evil),), rumour=True)


async def test_counters_survive_the_replacement_of_the_agent() -> None:
    clock = FakeClock()
    net = MemNet(clock)
    key = NodeKey.generate()
    stats, metrics, netstats = AgentStats(), NodeMetrics(), NetStats()
    first = GossipAgent(net.transport(key.peer_id), clock, key, stats=stats)
    _refuse_inf_evict(first, clock)
    first.stats.dropped["garbled"] += 3
    text = _scrape(metrics, first, netstats)
    assert re.search(r"# TYPE llmfabric_gossip_rejected(_total)? counter", text)
    assert _sample(text, "llmfabric_gossip_rejected_total", 'reason="bad_timestamp"') == 1
    assert _sample(text, "llmfabric_gossip_dropped_total", 'reason="garbled"') == 3
    # evicted: the node starts a new agent (new session, new replica) with the same stats
    second = GossipAgent(net.transport(key.peer_id), clock, key, stats=stats)
    _refuse_inf_evict(second, clock)
    text = _scrape(metrics, second, netstats)
    assert _sample(text, "llmfabric_gossip_rejected_total", 'reason="bad_timestamp"') == 2
    assert _sample(text, "llmfabric_gossip_dropped_total", 'reason="garbled"') == 3
    await net.aclose()


def test_transport_counts_are_counters_too() -> None:
    clock = FakeClock()
    key = NodeKey.generate()
    agent = GossipAgent(MemNet(clock).transport(key.peer_id), clock, key)
    netstats = NetStats()
    netstats.drop("unreachable", 2)
    netstats.handshakes_refused["admission"] += 1
    netstats.error("message_handler")
    text = _scrape(NodeMetrics(), agent, netstats)
    assert re.search(r"# TYPE llmfabric_net_dropped(_total)? counter", text)
    assert _sample(text, "llmfabric_net_dropped_total", 'reason="unreachable"') == 2
    assert _sample(text, "llmfabric_net_handshakes_refused_total", 'reason="admission"') == 1
    assert _sample(text, "llmfabric_net_errors_total", 'where="message_handler"') == 1


def test_the_node_hands_one_stats_object_to_every_agent(tmp_path: pathlib.Path) -> None:
    node = Node(build_config({}, {"home": tmp_path, "network_secret": "s" * 24, "gpu": "cpu",
                                  "listen": "127.0.0.1:0"}))
    assert node._new_agent().stats is node.gossip_stats
    assert node._new_agent().stats is node.gossip_stats


def test_background_failures_are_counters_by_task() -> None:
    """The supervisor's task failures, the gossip loops' restarts and the transport's caught
    handler errors: every background failure is counted, by where it happened."""
    from collections import Counter

    clock = FakeClock()
    key = NodeKey.generate()
    agent = GossipAgent(MemNet(clock).transport(key.peer_id), clock, key)
    agent.stats.loop_errors = 2
    failures: Counter[str] = Counter({"publisher": 3})
    metrics = NodeMetrics()
    metrics.watch_tasks(failures, agent.stats)
    netstats = NetStats()
    netstats.errors["request_handler"] += 1
    text = _scrape(metrics, agent, netstats)
    assert re.search(r"# TYPE llmfabric_node_task_failures(_total)? counter", text)
    assert _sample(text, "llmfabric_node_task_failures_total", 'task="publisher"') == 3
    assert _sample(text, "llmfabric_node_task_failures_total", 'task="gossip"') == 2
    assert _sample(text, "llmfabric_net_errors_total", 'where="request_handler"') == 1
    failures["rejoin"] += 1  # read at scrape time: later failures show up
    text = generate_latest(metrics.registry).decode()
    assert _sample(text, "llmfabric_node_task_failures_total", 'task="rejoin"') == 1


def test_connections_holding_a_handshake_slot_are_gauges() -> None:
    """Operators see a flood in progress: the peer listener's connections mid-handshake and
    the data plane's not yet proven, read at each refresh (they go down again)."""
    clock = FakeClock()
    key = NodeKey.generate()
    agent = GossipAgent(MemNet(clock).transport(key.peer_id), clock, key)
    peer_slots, dp_slots = SourceSlots(8, 8), SourceSlots(8, 8)
    metrics = NodeMetrics()
    metrics.watch_dataplane({}, {}, dp_slots)
    transport = SimpleNamespace(stats=NetStats(), handshaking=peer_slots)

    def scrape() -> str:
        metrics.refresh(agent, transport, SimpleNamespace(inflight=0))  # type: ignore[arg-type]
        return generate_latest(metrics.registry).decode()

    for _ in range(3):
        peer_slots.take("10.0.0.9")
    dp_slots.take("10.0.0.9")
    text = scrape()
    assert "llmfabric_net_handshakes_in_flight 3.0" in text
    assert "llmfabric_dataplane_unproven_connections 1.0" in text
    peer_slots.give_back("10.0.0.9")
    dp_slots.give_back("10.0.0.9")
    text = scrape()
    assert "llmfabric_net_handshakes_in_flight 2.0" in text
    assert "llmfabric_dataplane_unproven_connections 0.0" in text


def test_kv_event_drops_are_counters_of_the_engine_s_subscription(
        tmp_path: pathlib.Path) -> None:
    """KvEventsLink counted the messages it dropped (logging the first few): now they are on
    the node's /metrics, read from the engine's subscription of the moment."""
    import msgpack

    from llmfabric.agent.kv_events_config import KvEventsEndpoint
    from llmfabric.node.engine_link import KvEventsLink
    from llmfabric.routing.held_prefixes import HeldPrefixes

    node = Node(build_config({}, {"home": tmp_path, "network_secret": "s" * 24, "gpu": "cpu",
                                  "listen": "127.0.0.1:0"}))
    text = generate_latest(node.metrics.registry).decode()
    assert "llmfabric_kv_events_dropped" not in text  # (no engine: no subscription)
    link = KvEventsLink(KvEventsEndpoint("tcp://127.0.0.1:5557", topic="kv"),
                        HeldPrefixes(lambda: 0.0))
    node.supervisor._engine = SimpleNamespace(  # type: ignore[assignment]
        kv_events=link, proxy=None)
    good = msgpack.packb([1.0, [{"type": "AllBlocksCleared"}]])
    link.handle([b"kv", (1).to_bytes(8, "big"), good])
    link.handle([b"kv", b"x", b"\xc1 not msgpack"])
    link.handle([b"kv", (5).to_bytes(8, "big"), good])  # (2..4 missed)
    link.dropped["socket"] += 2
    text = generate_latest(node.metrics.registry).decode()
    assert re.search(r"# TYPE llmfabric_kv_events_dropped(_total)? counter", text)
    assert _sample(text, "llmfabric_kv_events_dropped_total", 'reason="malformed"') == 1
    assert _sample(text, "llmfabric_kv_events_dropped_total", 'reason="socket"') == 2
    assert _sample(text, "llmfabric_kv_events_dropped_total", 'reason="apply"') == 0
    assert "llmfabric_kv_events_received_total 3.0" in text
    assert "llmfabric_kv_events_gaps_total 1.0" in text


async def test_the_engine_proxy_s_otlp_counts_are_counters(tmp_path: pathlib.Path) -> None:
    """The engine proxy's exporter (node spans) logged its failed posts only."""
    from llmfabric.net.ports import free_port
    from llmfabric.telemetry.otlp import OtlpExporter

    node = Node(build_config({}, {"home": tmp_path, "network_secret": "s" * 24, "gpu": "cpu",
                                  "listen": "127.0.0.1:0"}))
    assert "llmfabric_node_otlp" not in generate_latest(node.metrics.registry).decode()
    exporter = OtlpExporter(f"http://127.0.0.1:{free_port()}/v1/traces", batch=1,
                            timeout_s=2.0)
    node.supervisor._engine = SimpleNamespace(  # type: ignore[assignment]
        kv_events=None, proxy=SimpleNamespace(exporter=exporter))
    try:
        for _ in range(3):
            exporter._queue.append({"trace_id": "0" * 32, "started_at": 1.0, "spans": []})
            await exporter.flush()
    finally:
        await exporter.aclose()
    text = generate_latest(node.metrics.registry).decode()
    assert re.search(r"# TYPE llmfabric_node_otlp_failed_posts(_total)? counter", text)
    assert "llmfabric_node_otlp_failed_posts_total 3.0" in text
    assert "llmfabric_node_otlp_dropped_traces_total 3.0" in text
    assert "llmfabric_node_otlp_exported_traces_total 0.0" in text
