"""Real nodes in one process on loopback (TLS transport, gossip, SWIM; `local` preset):

- an engine that fails to start: the node announces LEFT (not just DOWN), closes its
  transport and stops with status 3;
- the others forget a LEFT peer's addresses (the address book does not grow with churn);
- a bootstrap node that restarts with a new key on the same address is found again;
- a node that cannot be dialled keeps a relay: it moves to another relay when its relay
  leaves for good.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys
from collections.abc import AsyncIterator

import pytest

from llmfabric.net.ports import free_port
from llmfabric.node.daemon import Node
from llmfabric.registry.records import Lifecycle

from ._local_nodes import LocalNodes, eventually

pytestmark = pytest.mark.slow

SECRET = "resilience-test-secret-0123456789"


@pytest.fixture
async def fab(tmp_path: pathlib.Path) -> AsyncIterator[LocalNodes]:
    async with LocalNodes(tmp_path, lambda home: {"network_secret": SECRET}) as nodes:
        yield nodes


def knows(node: Node, other: Node) -> bool:
    agent = node.agent
    return agent is not None and any(
        v.session_id == other.session_id and v.state is not Lifecycle.LEFT
        for v in agent.nodes.all())


async def test_a_failed_engine_start_leaves_cleanly_and_peers_forget_it(fab: LocalNodes) -> None:
    boot = await fab.start("boot")
    failing = await fab.start(
        "failing", bootstrap=(boot.transport.listen_addr,), ready_timeout_s=30.0,
        engine_url=f"http://127.0.0.1:{free_port()}",
        process=(sys.executable, "-c", "import time, sys; time.sleep(3); sys.exit(1)"),
    )
    sid, peer = failing.session_id, failing.key.peer_id
    await eventually(lambda: knows(boot, failing), 10, "boot knows the failing node")
    assert peer in boot.transport.book
    code = await asyncio.wait_for(failing.wait_stopped(), 30)
    assert code == 3 and failing.exit_code == 3
    assert failing.supervisor.failures == {"engine-start": 1}  # counted (/metrics)
    assert failing.transport._closing  # stop() ran: the transport is closed
    assert boot.agent is not None
    await eventually(lambda: boot.agent.replica.entries[sid].state is Lifecycle.LEFT,  # type: ignore[union-attr]
                     10, "boot sees the failed node LEFT")
    entry = boot.agent.replica.entries[sid]
    # LEFT by the node's own announcement (a record), not by an eviction after suspicion
    assert entry.record is not None and entry.record.record.state is Lifecycle.LEFT
    assert entry.evict is None
    assert peer not in boot.transport.book  # forgotten: the book does not grow with churn


async def test_a_bootstrap_restarted_with_a_new_key_is_found_again(fab: LocalNodes) -> None:
    addr = f"127.0.0.1:{free_port()}"
    boot = await fab.start("boot", listen=addr)
    node = await fab.start("node", bootstrap=(addr,))
    await eventually(lambda: knows(boot, node) and knows(node, boot), 10, "joined")
    old_peer = boot.key.peer_id
    await boot.stop()
    fab.nodes.remove(boot)
    new_boot = await fab.start("boot-new-key", listen=addr)  # another home: another key
    assert new_boot.key.peer_id != old_peer
    await eventually(lambda: knows(new_boot, node) and knows(node, new_boot), 40,
                     "the node found the restarted bootstrap by its address")
    assert node.agent is not None and node.agent.stats.rebootstraps >= 1


async def test_a_nated_node_moves_to_another_relay_when_its_relay_leaves(fab: LocalNodes) -> None:
    boot = await fab.start("boot")
    boot_addr = boot.transport.listen_addr
    relays = [await fab.start(f"relay{i}", relay=True, bootstrap=(boot_addr,)) for i in (1, 2)]
    # A public address nobody answers on: the dial-back fails, so the node uses relays.
    nated = await fab.start("nated", bootstrap=(boot_addr,), public_addr="127.0.0.1:1")
    relay_ids = {r.key.peer_id: r for r in relays}
    await eventually(lambda: bool(set(nated.transport.relays) & set(relay_ids)), 40,
                     "the NATed node registered with a relay")
    first = relay_ids[nated.transport.relays[0]]
    other = next(r for r in relays if r is not first)
    await first.stop()  # leaves for good (LEFT)
    fab.nodes.remove(first)
    await eventually(lambda: nated.transport.relays == (other.key.peer_id,), 40,
                     "the NATed node moved to the remaining relay")
    assert first.key.peer_id not in nated.transport.relays_in_use

    def published() -> bool:  # the record others see names the new relay
        assert boot.agent is not None
        view = boot.agent.nodes.get(nated.session_id)
        return view is not None and view.record.meta.relays == (other.key.peer_id,)

    await eventually(published, 10, "the record names the new relay")
