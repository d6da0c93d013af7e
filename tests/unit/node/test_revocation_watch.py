"""The node's revocation list file (node/revocations.py): read at start, polled on the node's
clock, a broken, forged or older list refused with the list in force kept (never an empty
one); --revocation-list only on certificate networks."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib

import pytest

from llmfabric.identity.admission import encode_public_key
from llmfabric.identity.errors import AdmissionError
from llmfabric.identity.keys import NodeKey
from llmfabric.identity.revocation import RevocationList, Revocations, sign_revocations
from llmfabric.node.admission import revocations_from_config
from llmfabric.node.config import ConfigError, NodeConfig
from llmfabric.node.revocations import POLL_S, RevocationWatch
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.hostile

NET = "lab"
OPERATOR = NodeKey.generate()


def _write(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # (a new inode: seen as a change whatever the mtime resolution)


async def test_the_list_is_followed_and_a_bad_one_never_replaces_it(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    path = tmp_path / "revoked.json"
    a, b = NodeKey.generate().peer_id, NodeKey.generate().peer_id
    _write(path, sign_revocations(OPERATOR, NET, clock.wall(), [a]).to_json())
    revs = Revocations(OPERATOR.public_bytes, NET)
    seen: list[RevocationList] = []
    watch = RevocationWatch(path, revs, clock, seen.append)
    watch.load_initial()
    assert revs.refusal(a) is not None and seen == []
    task = asyncio.ensure_future(watch.run())
    try:
        await clock.advance(POLL_S + 0.1)
        assert seen == []  # unchanged file: nothing read
        _write(path, sign_revocations(OPERATOR, NET, clock.wall() + 1, [a, b]).to_json())
        await clock.advance(POLL_S)
        assert len(seen) == 1 and revs.refusal(b) is not None
        in_force = revs.current

        caplog.set_level(logging.ERROR, "llmfabric.node.revocations")
        bad = [
            "{ truncated",  # half a file
            sign_revocations(NodeKey.generate(), NET, clock.wall() + 2).to_json(),  # forged
            sign_revocations(OPERATOR, "other", clock.wall() + 2).to_json(),  # other network
            sign_revocations(OPERATOR, NET, clock.wall() - 100).to_json(),  # an older list
            "",  # emptied
        ]
        for i, text in enumerate(bad):
            _write(path, text)
            await clock.advance(POLL_S)
            assert revs.current is in_force, text  # the list in force stays
            assert watch.refused == i + 1
        await clock.advance(3 * POLL_S)
        assert watch.refused == len(bad)  # logged once per version of the file
        path.unlink()
        await clock.advance(POLL_S)
        assert revs.current is in_force and watch.refused == len(bad) + 1
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == len(bad) + 1
        assert len(seen) == 1
    finally:
        task.cancel()


def test_a_list_that_fails_at_start_stops_the_start(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "revoked.json"
    revs = Revocations(OPERATOR.public_bytes, NET)
    watch = RevocationWatch(path, revs, FakeClock(), lambda rl: None)
    with pytest.raises(AdmissionError, match="cannot read"):
        watch.load_initial()
    path.write_text(sign_revocations(NodeKey.generate(), NET, 1.0).to_json())
    with pytest.raises(AdmissionError, match="another operator"):
        watch.load_initial()
    assert revs.current is None


def test_a_revocation_list_needs_a_certificate_network(tmp_path: pathlib.Path) -> None:
    lst = tmp_path / "revoked.json"
    with pytest.raises(ConfigError, match="certificate network"):
        revocations_from_config(NodeConfig(home=tmp_path, network_secret="s" * 32,
                                           revocation_list=lst))
    cert = tmp_path / "member.json"
    cert.write_text("{}")
    revs = revocations_from_config(NodeConfig(
        home=tmp_path, network=NET, membership_cert=cert, revocation_list=lst,
        operator_key=encode_public_key(OPERATOR.public_bytes)))
    assert revs is not None and revs.network == NET
    assert revocations_from_config(NodeConfig(home=tmp_path)) is None
    # a certificate network holds lists without the file too (learnt from peers)
    revs = revocations_from_config(NodeConfig(
        home=tmp_path, network=NET, membership_cert=cert,
        operator_key=encode_public_key(OPERATOR.public_bytes)))
    assert revs is not None and revs.current is None


def _cert_node_config(tmp_path: pathlib.Path, lst: pathlib.Path) -> NodeConfig:
    from llmfabric.identity.admission import sign_membership
    from llmfabric.node.config import build_config

    key, _ = NodeKey.load_or_create(tmp_path)
    cert = tmp_path / "member.json"
    cert.write_text(sign_membership(OPERATOR, key.peer_id, NET, 4_000_000_000.0).to_json())
    return build_config({}, {"home": tmp_path, "network": NET, "membership_cert": cert,
                             "operator_key": encode_public_key(OPERATOR.public_bytes),
                             "revocation_list": lst, "gpu": "cpu",
                             "listen": "127.0.0.1:0"})


async def test_a_node_applies_its_revocation_list(tmp_path: pathlib.Path) -> None:
    """The node refuses revoked members from its start, and a new list closes their
    connections, drops their registry sessions and data-plane keys (RevocationFollower.apply)."""
    from llmfabric.node.daemon import Node, NodeError

    lst = tmp_path / "revoked.json"
    cfg = _cert_node_config(tmp_path, lst)
    with pytest.raises(NodeError, match="--revocation-list: cannot read"):
        Node(cfg)
    first, second = NodeKey.generate().peer_id, NodeKey.generate().peer_id
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0, [first]).to_json())
    node = Node(cfg)
    try:
        assert node.transport.refused == {first}
        assert node.revocations is not None and node.revocations.refusal(first) is not None
        assert node.providers.revocations is node.revocations
        assert node.admission.revocations is node.revocations  # type: ignore[attr-defined]
        node.revocations.offer(sign_revocations(OPERATOR, NET, 1_700_000_001.0,
                                                [first, second]))
        node.revoking.apply(node.revocations.current)  # type: ignore[union-attr]
        assert node.transport.refused == {first, second}
        assert node.exit_code == 0 and not node.stopping
    finally:
        await node.transport.aclose()


def test_a_node_whose_own_key_is_on_the_list_does_not_start(tmp_path: pathlib.Path) -> None:
    """Review 2026-12-02, left open (3): a node started with its own key (or certificate)
    on the list, from its file or the copy a peer taught it, came up and served on."""
    from llmfabric.identity.admission import MembershipCert
    from llmfabric.node.daemon import EXIT_REVOKED, Node, NodeRevoked
    from llmfabric.node.revocations import save_list

    lst = tmp_path / "revoked.json"
    cfg = _cert_node_config(tmp_path, lst)
    me = NodeKey.load_or_create(tmp_path)[0].peer_id
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0, [me]).to_json())
    with pytest.raises(NodeRevoked, match="own membership is revoked: its key") as revoked:
        Node(cfg)
    assert "(issued at 2023-11-14T22:13:20.000Z)" in str(revoked.value)  # (not Unix seconds)
    cert_id = MembershipCert.load(tmp_path / "member.json").cert_id
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_001.0, cert_ids=[cert_id]
                                    ).to_json())
    with pytest.raises(NodeRevoked, match="its certificate"):
        Node(cfg)
    # a newer list learnt from a peer and kept under --home counts as well
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_002.0).to_json())
    save_list(tmp_path, sign_revocations(OPERATOR, NET, 1_700_000_003.0, [me]))
    with pytest.raises(NodeRevoked) as err:
        Node(cfg)
    assert f"exit status {EXIT_REVOKED}" in str(err.value)


def test_llmfabric_start_exits_with_the_revoked_status(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import click

    from llmfabric.cli.start import run_node
    from llmfabric.node.daemon import EXIT_REVOKED

    monkeypatch.setitem(sys.modules, "uvloop", None)  # (the test's own event loop policy)
    lst = tmp_path / "revoked.json"
    cfg = _cert_node_config(tmp_path, lst)
    me = NodeKey.load_or_create(tmp_path)[0].peer_id
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0, [me]).to_json())
    with pytest.raises(click.ClickException) as err:
        run_node(cfg, banner=False)
    assert err.value.exit_code == EXIT_REVOKED and "revoked" in err.value.message


async def test_a_node_whose_own_key_is_revoked_leaves_and_exits(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review 2026-12-02, left open (3): a node that learnt a list revoking its own key only
    logged an error and served on with its last record (other members refused it). It
    announces LEFT now, while peers that have not learnt the list yet still take it, and
    stops with its own exit status."""
    import random

    from llmfabric.gossip.agent import GossipAgent
    from llmfabric.gossip.config import PRESETS
    from llmfabric.identity.admission import sign_membership
    from llmfabric.node.daemon import EXIT_REVOKED, Node
    from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
    from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
    from llmfabric.testing.memnet import MemNet

    lst = tmp_path / "revoked.json"
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0).to_json())
    node = Node(_cert_node_config(tmp_path, lst))
    assert node.revocations is not None
    clock = FakeClock()
    net = MemNet(clock, seed=3)
    agents: list[GossipAgent] = []

    async def add(key: NodeKey) -> GossipAgent:
        cert = sign_membership(OPERATOR, key.peer_id, NET, 4_000_000_000.0)
        agent = GossipAgent(
            net.transport(key.peer_id), clock, key,
            NodeMeta(provider_id="p", models=(ServedModel("m"),), cert=cert.to_json()),
            config=PRESETS["local"], seeds=[agents[0].peer_id] if agents else [],
            rng=random.Random(len(agents)), session_id=None,
            policy=CertRecordPolicy(ProviderVerifier(  # (a peer without the list yet)
                OPERATOR.public_bytes, NET, clock.wall, Revocations(OPERATOR.public_bytes,
                                                                    NET))))
        await agent.start()
        agent.set_state(Lifecycle.SERVING)
        agents.append(agent)
        return agent

    try:
        observer = await add(NodeKey.generate())
        mine = await add(node.key)
        assert await clock.run_until(lambda: len(observer.nodes.routable()) == 2, within=30)
        node.supervisor._session = mine  # (as if the node ran this session)
        other = NodeKey.generate().peer_id
        node.revocations.offer(sign_revocations(OPERATOR, NET, 1_700_000_001.0,
                                                [other, node.key.peer_id]))
        caplog.set_level(logging.ERROR, "llmfabric.node.daemon")
        node.revoking.apply(node.revocations.current)  # type: ignore[arg-type,union-attr]
        assert node.stopping or node._shutdown is not None
        assert node.transport.refused == {other}  # never ourselves
        assert await clock.run_until(lambda: node._stopped.is_set(), within=30)
        assert await node.wait_stopped() == EXIT_REVOKED == node.exit_code == 7
        view = observer.nodes.get(mine.session_id)
        assert view is not None and view.state is Lifecycle.LEFT
        assert [r for r in caplog.records if "own membership is revoked" in r.getMessage()
                and f"status {EXIT_REVOKED}" in r.getMessage()]
    finally:
        node.supervisor._session = None
        for a in agents:
            await a.aclose()
        await net.aclose()
        await node.transport.aclose()


async def test_an_older_session_on_a_revoked_certificate_does_not_stop_the_node(
        tmp_path: pathlib.Path) -> None:
    """Only what the node publishes now counts: a certificate it no longer uses (it was
    re-certified) being revoked leaves it serving."""
    from llmfabric.identity.admission import sign_membership
    from llmfabric.node.daemon import Node

    lst = tmp_path / "revoked.json"
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0).to_json())
    node = Node(_cert_node_config(tmp_path, lst))
    try:
        assert node.revocations is not None
        old = sign_membership(OPERATOR, node.key.peer_id, NET, 3_900_000_000.0)
        node.revocations.offer(sign_revocations(OPERATOR, NET, 1_700_000_001.0,
                                                cert_ids=[old.cert_id]))
        node.revoking.apply(node.revocations.current)  # type: ignore[arg-type,union-attr]
        assert node.exit_code == 0 and not node.stopping
    finally:
        await node.transport.aclose()


async def test_a_revoked_certificate_drops_its_sessions_not_the_key_s_new_one(
        tmp_path: pathlib.Path) -> None:
    """Review 2026-12-02: a certificate revoked by id purged every session of the key. A
    member the operator re-certified (new certificate, restarted: a new session) still had
    its old session's LEFT record held for retention, so the list tombstoned its new,
    valid session on every node (gone from their views until it restarted again) and closed
    its connections."""
    import random

    from llmfabric.gossip.agent import GossipAgent
    from llmfabric.gossip.config import PRESETS
    from llmfabric.identity.admission import sign_membership
    from llmfabric.node.daemon import Node
    from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
    from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
    from llmfabric.testing.memnet import MemNet

    lst = tmp_path / "revoked.json"
    lst.write_text(sign_revocations(OPERATOR, NET, 1_700_000_000.0).to_json())
    node = Node(_cert_node_config(tmp_path, lst))
    assert node.revocations is not None
    clock = FakeClock()
    net = MemNet(clock, seed=2)
    agents: list[GossipAgent] = []

    async def add(key: NodeKey) -> tuple[GossipAgent, str]:
        cert = sign_membership(OPERATOR, key.peer_id, NET, 4_000_000_000.0 + len(agents))
        agent = GossipAgent(
            net.transport(key.peer_id), clock, key,
            NodeMeta(provider_id="p", models=(ServedModel("m"),), cert=cert.to_json()),
            config=PRESETS["local"], seeds=[agents[0].peer_id] if agents else [],
            rng=random.Random(len(agents)), session_id=None,
            policy=CertRecordPolicy(ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall,
                                                     node.revocations)))
        await agent.start()
        agent.set_state(Lifecycle.SERVING)
        agents.append(agent)
        return agent, cert.cert_id

    try:
        observer, _ = await add(NodeKey.generate())
        member = NodeKey.generate()
        old, old_cert = await add(member)
        assert await clock.run_until(lambda: len(observer.nodes.routable()) == 2, within=30)
        await old.aclose()  # the member restarts under its new certificate
        new, _ = await add(member)
        assert await clock.run_until(lambda: {v.session_id for v in observer.nodes.all()} == {
            observer.session_id, old.session_id, new.session_id}
            and len(observer.nodes.routable()) == 2, within=30)

        node.supervisor._session = observer  # (as if the node ran this session)
        node.revocations.offer(sign_revocations(OPERATOR, NET, 1_700_000_001.0,
                                                cert_ids=[old_cert]))
        node.revoking.apply(node.revocations.current)  # type: ignore[arg-type,union-attr]
        assert old.session_id not in observer.replica.entries  # (the revoked certificate's)
        assert [v.session_id for v in observer.nodes.by_peer(member.peer_id)] == [
            new.session_id]
        new.update_self(NodeMeta(provider_id="p2", models=(ServedModel("m"),),
                                 cert=new.record.meta.cert))
        await clock.advance(30)
        view = observer.nodes.get(new.session_id)
        assert view is not None and view.record.meta.provider_id == "p2"  # (still followed)
    finally:
        node.supervisor._session = None
        for a in agents:
            await a.aclose()
        await net.aclose()
        await node.transport.aclose()


async def test_the_list_put_in_force_is_logged_with_its_issue_time_in_utc(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """It was logged in Unix seconds ("(issued at 1700000000)")."""
    path = tmp_path / "revoked.json"
    _write(path, sign_revocations(OPERATOR, NET, 1_700_000_000.0).to_json())
    watch = RevocationWatch(path, Revocations(OPERATOR.public_bytes, NET), FakeClock(),
                            lambda rl: None)
    watch.load_initial()
    _write(path, sign_revocations(OPERATOR, NET, 1_700_000_000.5, [NodeKey.generate().peer_id]
                                  ).to_json())
    caplog.set_level(logging.WARNING, "llmfabric.node.revocations")
    assert watch.poll() is True
    [line] = [r.getMessage() for r in caplog.records if "in force" in r.getMessage()]
    assert line.endswith("1 key(s), 0 certificate(s) revoked (issued at "
                         "2023-11-14T22:13:20.500Z)")
