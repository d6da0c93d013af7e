"""A revocation list handed to one node reaches the others (real nodes in one process on
loopback, certificate network, `local` preset): they fetch it from a peer over the peer
protocol, verify it, refuse and drop the revoked member, and keep the list in their state
directory; a node restarted without --revocation-list still holds it."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmfabric.identity.admission import encode_public_key, sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.identity.revocation import sign_revocations
from llmfabric.node.daemon import Node
from llmfabric.node.revocations import LEARNT_FILE
from llmfabric.registry.records import Lifecycle

from ._local_nodes import LocalNodes, eventually

pytestmark = [pytest.mark.slow, pytest.mark.hostile]

NET = "lab"
OPERATOR = NodeKey.generate()


def certified(home: pathlib.Path) -> dict[str, Any]:
    """A node's options for network NET: its key, certified by OPERATOR."""
    key, _ = NodeKey.load_or_create(home)
    cert = home / "member.json"
    cert.write_text(sign_membership(OPERATOR, key.peer_id, NET, time.time() + 86400).to_json())
    return {"network": NET, "membership_cert": cert,
            "operator_key": encode_public_key(OPERATOR.public_bytes)}


@pytest.fixture
async def fab(tmp_path: pathlib.Path) -> AsyncIterator[LocalNodes]:
    async with LocalNodes(tmp_path, certified) as nodes:
        yield nodes


def live_peers(node: Node) -> set[str]:
    agent = node.agent
    return set() if agent is None else {
        v.record.peer_id for v in agent.nodes.all() if v.state is not Lifecycle.LEFT}


async def test_a_list_given_to_one_node_reaches_the_others(
        fab: LocalNodes, tmp_path: pathlib.Path) -> None:
    lst = tmp_path / "revoked.json"
    lst.write_text(sign_revocations(OPERATOR, NET, time.time() - 60).to_json())  # (empty)
    a = await fab.start("a", revocation_list=lst)
    boot = (a.transport.listen_addr,)
    b = await fab.start("b", bootstrap=boot)
    c = await fab.start("c", bootstrap=boot)
    leaked = await fab.start("leaked", bootstrap=boot)
    everyone = {n.key.peer_id for n in (a, b, c, leaked)}
    await eventually(lambda: all(live_peers(n) == everyone for n in (a, b, c)), 20,
                     "the four nodes know each other")

    rl = sign_revocations(OPERATOR, NET, time.time(), [leaked.key.peer_id])
    tmp = lst.with_name("revoked.tmp")
    tmp.write_text(rl.to_json())
    os.replace(tmp, lst)
    a.reload()  # (SIGHUP: A reads the file at once)
    assert a.revocations is not None and a.revocations.current == rl

    def learnt(n: Node) -> bool:
        return (n.revocations is not None and n.revocations.current == rl
                and leaked.key.peer_id not in live_peers(n)
                and leaked.key.peer_id in n.transport.refused)

    await eventually(lambda: all(learnt(n) for n in (a, b, c)), 30,
                     "B and C learnt the list from a peer and dropped the revoked member")
    for n in (b, c):
        assert n.revoking is not None and n.revoking.sync.learnt == 1
        assert n.revoking.sync.failed == 0
        await eventually(lambda n=n: (n.config.home / LEARNT_FILE).exists(), 10,  # type: ignore[misc]
                         "the list is kept in the state directory")
        assert n.agent is not None and n.agent.record.meta.revocations_at == rl.issued_at

    # B restarts without --revocation-list: it holds the list from its state directory
    await fab.stop(b)
    b2 = await fab.start("b", bootstrap=boot)
    assert b2.revocations is not None and b2.revocations.current == rl
    assert leaked.key.peer_id in b2.transport.refused
