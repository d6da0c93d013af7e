"""A revoked member's registry sessions are dropped and stay dropped (GossipAgent.purge_peer
and the certificate record policy with a revocation list), on virtual time over the
in-memory network, while other members that lack the list keep offering them."""

from __future__ import annotations

import random

import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS
from llmfabric.identity.admission import sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.identity.revocation import Revocations, sign_revocations
from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.routing.replica_source import ReplicaCandidateSource
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet

pytestmark = pytest.mark.hostile

NET = "lab"
OPERATOR = NodeKey.generate()


@pytest.mark.parametrize("by", ["key", "certificate"])
async def test_a_revoked_member_s_sessions_are_dropped_and_not_taken_back(by: str) -> None:
    """Certificates could not be revoked: a leaked member key stayed in every replica, and
    routable, until its certificate expired."""
    clock = FakeClock()
    net = MemNet(clock, seed=1)
    cfg = PRESETS["local"]
    revs = Revocations(OPERATOR.public_bytes, NET)  # the list of node A (B lacks it)
    agents: list[GossipAgent] = []
    certs: dict[str, str] = {}

    async def add(key: NodeKey, policy_revs: Revocations | None) -> GossipAgent:
        cert = sign_membership(OPERATOR, key.peer_id, NET, clock.wall() + 86400)
        certs[key.peer_id] = cert.cert_id
        verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall, policy_revs)
        agent = GossipAgent(
            net.transport(key.peer_id), clock, key,
            NodeMeta(provider_id="p", models=(ServedModel("m"),), cert=cert.to_json()),
            config=cfg, seeds=[agents[0].peer_id] if agents else [],
            rng=random.Random(len(agents)), policy=CertRecordPolicy(verifier),
            session_id=None)
        await agent.start()
        agent.set_state(Lifecycle.SERVING)
        agents.append(agent)
        return agent

    try:
        a = await add(NodeKey.generate(), revs)
        b = await add(NodeKey.generate(), None)
        leaked = NodeKey.generate()
        v = await add(leaked, None)
        assert await clock.run_until(lambda: all(
            len(x.nodes.routable()) == 3 for x in agents), within=30)

        # A's routing index follows its replica (as an ingress's does)
        routes = ReplicaCandidateSource(lambda: a.replica)
        assert v.session_id in {c.session_id for c in routes.candidates("m")}

        revs.offer(sign_revocations(
            OPERATOR, NET, clock.wall(), [leaked.peer_id] if by == "key" else [],
            [certs[leaked.peer_id]] if by == "certificate" else []))
        assert a.purge_peer(leaked.peer_id) == [v.session_id]
        assert a.nodes.by_peer(leaked.peer_id) == []
        assert leaked.peer_id not in a.member_peers()
        # ... and drops its candidates at once (the purge told the replica's listeners)
        assert v.session_id not in {c.session_id for c in routes.candidates("m")}
        assert len(routes.candidates("m")) == 2
        assert a.purge_peer(a.peer_id) == []  # (never our own sessions)

        # B still holds it and offers it; the member keeps refreshing: A takes none back.
        v.update_self(NodeMeta(provider_id="p2", models=(ServedModel("m"),),
                               cert=v.record.meta.cert))
        await clock.advance(60)
        assert a.nodes.by_peer(leaked.peer_id) == []
        assert len(b.nodes.by_peer(leaked.peer_id)) == 1
        assert a.replica.rejected["tombstoned"] > 0

        # A new session of the revoked key is refused by the record policy; a certificate
        # revoked by id revokes only itself: the key's new certificate is taken.
        await v.aclose()
        v2 = await add(leaked, None)  # (with a newly signed certificate)
        await clock.advance(60)
        if by == "key":
            assert v2.session_id not in a.replica.entries
            assert a.replica.rejected["revoked"] > 0
            assert len(a.nodes.routable()) == 2  # A and B route to each other still
        else:
            assert v2.session_id in a.replica.entries
    finally:
        for x in agents:
            await x.aclose()
        await net.aclose()
