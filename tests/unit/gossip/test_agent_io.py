"""Agent robustness: garbage and forgeries are dropped and counted; large syncs are split;
idle traffic stays small and does not grow with the cluster."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from llmfabric.gossip.wire import Gossip, encode
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import RECORD_DOMAIN, encode_body
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta

from .conftest import Cluster


async def test_garbage_and_forgeries_are_dropped_and_counted(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    a = await c.add()
    b = await c.add()
    assert await c.clock.run_until(c.converged, within=5)
    evil = c.net.transport("evil")
    for blob in (b"", b"\xff" * 10, b"\x94\x63\x01\xa0\x90", b"\x00" * 100_000):
        evil.send(a.peer_id, blob)
    # a forged record: signed by one key, claiming another's peer id
    k1, k2 = NodeKey.generate(), NodeKey.generate()
    rec = dataclasses.replace(RecordOwner(k1, NodeMeta(), wall=c.clock.wall()).record,
                              peer_id=k2.peer_id)
    body = encode_body(rec)
    evil.send(a.peer_id, encode(Gossip(((1, body, k1.sign(RECORD_DOMAIN + body)),)), "x"))
    evil.send(a.peer_id, encode(Gossip(((1, body, b"\x00" * 64),)), "x"))
    # a valid body (peer id, session and key all match) with a zeroed and with a wrong
    # signature: only the signature check can refuse these
    honest = RecordOwner(k1, NodeMeta(provider_id="honest"), wall=c.clock.wall()).current
    wrong = k2.sign(RECORD_DOMAIN + honest.body)
    for sig in (b"\x00" * 64, wrong):
        evil.send(a.peer_id, encode(Gossip(((1, honest.body, sig),)), "x"))
    fact = make_fact(k1, FactKind.SUSPECT, b.session_id, 0, c.clock.wall())
    evil.send(a.peer_id, encode(Gossip(((2, fact.body, b"\x00" * 64),)), "x"))
    await c.clock.advance(1.0)
    assert a.stats.dropped["garbled"] >= 2 and a.stats.dropped["version"] == 1
    assert a.stats.dropped["oversized"] == 1
    assert a.stats.rejected["peer_id"] == 2
    assert a.stats.rejected["signature"] == 3
    assert rec.session_id not in a.replica.entries
    assert honest.session_id not in a.replica.entries
    assert not a.nodes.get(b.session_id).suspected  # type: ignore[union-attr]
    # and it keeps working
    b.set_state(Lifecycle.DOWN)
    assert await c.clock.run_until(
        lambda: a.nodes.get(b.session_id).state is Lifecycle.DOWN, within=2)  # type: ignore[union-attr]
    assert a.stats.loop_errors == 0


async def test_big_sync_is_split_into_bounded_messages(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.config = c.config.with_(max_message_bytes=4_000)
    for _ in range(12):
        await c.add(seeds=[])  # 12 isolated nodes, each knows only itself
    big = NodeMeta(provider_id="x" * 300, labels=tuple((f"k{i}", "v" * 20) for i in range(8)))
    for a in c.agents:
        a.update_self(big)
    hub = c.agents[0]
    for a in c.agents[1:]:
        a.seeds = [hub.peer_id]
    assert await c.clock.run_until(
        lambda: c.converged() and len(hub.replica.entries) == 12, within=30)
    assert all(a.stats.dropped["oversized_out"] == 0 for a in c.agents)
    # the replica is bigger than one message, yet nothing was oversized: syncs were split
    total = sum(len(e.record.body) + 64 for e in hub.replica.entries.values() if e.record)
    assert total > 2 * 4_000


async def test_idle_traffic_is_small_and_flat(make_cluster: Callable[..., Cluster]) -> None:
    per_node = {}
    for n in (6, 18):
        c = make_cluster(seed=n, delay=(0.001, 0.002))
        for _ in range(n):
            await c.add()
        assert await c.clock.run_until(c.converged, within=20)
        await c.clock.advance(5.0)  # let rumours die out
        before = sum(c.net.bytes_sent.values())
        await c.clock.advance(30.0)
        per_node[n] = (sum(c.net.bytes_sent.values()) - before) / n / 30.0
        await c.aclose()
    print("idle B/s per node", per_node)
    assert per_node[6] < 1000 and per_node[18] < 1000, per_node
    assert per_node[18] < per_node[6] * 1.5, per_node
