"""A session change (an engine restart, a rejoin, a release) is public only once it is made:
no peer hears of the node's new session while the node still shows its old one.

The restart builds the new session already SERVING, then announces LEFT for the old one (a
gossip tick of waiting) and only then starts the new one and makes it current. A session
that published before start() had its SERVING record routed to by ingresses during that
wait, while the node's own view (`/v1/fabric/self`, Node.session) still showed the old,
LEFT session; on a loaded machine the wait stretches to seconds
(tests/integration/test_engine_tree.py failed that way). Real node, real gossip agents, an
in-memory network and the fake clock."""

from __future__ import annotations

import asyncio
import pathlib

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import preset
from llmfabric.identity.keys import NodeKey
from llmfabric.node.config import build_config
from llmfabric.node.daemon import Node
from llmfabric.registry.records import Lifecycle, NodeMeta
from llmfabric.registry.replica import Change
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet


async def test_peers_hear_of_a_new_session_only_once_the_node_shows_it(
        tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    net = MemNet(clock, delay=0.001)
    node = Node(build_config({}, {"home": tmp_path, "network_secret": "s" * 24, "gpu": "cpu",
                                  "listen": "127.0.0.1:0", "preset": "local"}), clock=clock)
    node.transport = net.transport(node.key.peer_id)  # type: ignore[assignment]
    ingress_key = NodeKey.generate()
    ingress = GossipAgent(net.transport(ingress_key.peer_id), clock, ingress_key,
                          config=preset("local"))
    await ingress.start()
    node.peering.seeds[:] = [ingress_key.peer_id]
    meta = NodeMeta(engine="sim")
    old = await node.change_session(meta, serving=True)
    assert await clock.run_until(lambda: old.session_id in ingress.replica.entries, 5.0)

    # Whenever the ingress learns of a session of the node, the node must already show it.
    early: list[tuple[str, str]] = []

    def on_change(change: Change) -> None:
        sid = change.session_id
        if sid != ingress.session_id and sid not in (old.session_id, node.session_id):
            early.append((sid, node.session_id))

    ingress.add_listener(on_change)
    old.set_state(Lifecycle.DOWN)  # the engine went down
    await clock.advance(1.0)
    restart = asyncio.ensure_future(
        node.change_session(meta, serving=True, leave_old=True))  # as the engine restart
    await clock.advance(2.0)
    fresh = await restart
    assert node.session is fresh and fresh is not old
    assert early == [], "the ingress heard of the new session before the node showed it"
    assert await clock.run_until(
        lambda: (e := ingress.replica.entries.get(fresh.session_id)) is not None
        and e.state is Lifecycle.SERVING, 5.0), "the new session never reached the ingress"
    assert ingress.replica.entries[old.session_id].state is Lifecycle.LEFT
    await node.supervisor.stop()
    await ingress.aclose()
    await net.aclose()
