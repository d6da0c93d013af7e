"""Provider identities are bound to keys: allowlists match certificates or key fingerprints,
never the free-text provider name a record claims; alias squatting is flagged."""

from __future__ import annotations

import dataclasses

import pytest

from llmfabric.identity.admission import sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.ingress.sources import RecordsCandidateSource
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord, ServedModel
from llmfabric.registry.replica import Replica
from llmfabric.routing import Router, eligible, make_policy, route_request
from llmfabric.routing.router import NoRoute
from llmfabric.testing.fake_clock import FakeClock

pytestmark = pytest.mark.hostile

OPERATOR = NodeKey.generate()
NET = "lab-net"


def _record(key: NodeKey, clock: FakeClock, *, provider: str, cert: str = "",
            models: tuple[ServedModel, ...] = (ServedModel("llama"),)) -> NodeRecord:
    own = RecordOwner(key, NodeMeta(provider_id=provider, models=models, cert=cert),
                      wall=clock.wall())
    return own.set_state(Lifecycle.SERVING, wall=clock.wall()).record


def _cert(key: NodeKey, clock: FakeClock, **grants: object) -> str:
    return sign_membership(OPERATOR, key.peer_id, NET, clock.wall() + 3600,
                           **grants).to_json()  # type: ignore[arg-type]


def test_on_a_psk_network_the_allowlist_matches_key_fingerprints_only() -> None:
    clock = FakeClock()
    honest, spoofer = NodeKey.generate(), NodeKey.generate()
    recs = [_record(honest, clock, provider="my-lab")]
    recs += [_record(spoofer, clock, provider="my-lab") for _ in range(50)]
    source = RecordsCandidateSource(lambda: [(r, False) for r in recs])
    cands = source.candidates("llama")
    assert len(cands) == 51
    # the claimed name matches nobody; the honest key's fingerprint matches only it
    assert eligible(cands, route_request("llama", providers_header="my-lab")) == []
    kept = eligible(cands, route_request("llama", providers_header=honest.peer_id))
    assert [c.peer_id for c in kept] == [honest.peer_id]
    assert {c.claimed_provider for c in cands} == {"my-lab"}  # still shown, never trusted
    # the refusal says what an allowlist matches (a user tried its --provider name)
    refused = Router(make_policy()).route(route_request("llama", providers_header="my-lab"),
                                          cands)
    assert isinstance(refused, NoRoute)
    assert "GET /v1/models lists them: on a network-secret fabric, peer ids" in (
        refused.message("llama"))


def test_on_a_certificate_network_the_certificate_names_the_provider() -> None:
    clock = FakeClock()
    verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall)
    honest, spoofer, rogue = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    other_operator = NodeKey.generate()
    forged = sign_membership(other_operator, rogue.peer_id, NET, clock.wall() + 3600,
                             provider="my-lab").to_json()
    recs = [
        _record(honest, clock, provider="my-lab", cert=_cert(honest, clock, provider="my-lab")),
        # certified as "evil-corp" but claiming my-lab, 20 times over
        *[_record(spoofer, clock, provider="my-lab",
                  cert=_cert(spoofer, clock, provider="evil-corp")) for _ in range(20)],
        # a certificate for my-lab signed by somebody else's operator key
        _record(rogue, clock, provider="my-lab", cert=forged),
        # another key's (valid) certificate copied into this record
        _record(rogue, clock, provider="my-lab", cert=_cert(honest, clock, provider="my-lab")),
    ]
    source = RecordsCandidateSource(lambda: [(r, False) for r in recs], identify=verifier.identity)
    req = route_request("llama", metadata={"providers": ["my-lab"]})
    router = Router(make_policy("random", __import__("random").Random(1)))
    cands = source.candidates("llama")
    for attempt in range(30):
        d = router.route(req, cands, [], attempt)
        assert not isinstance(d, NoRoute) and d.candidate.peer_id == honest.peer_id
    assert {c.provider_id for c in cands if c.peer_id == spoofer.peer_id} == {"evil-corp"}
    assert {c.provider_id for c in cands if c.peer_id == rogue.peer_id} == {""}


async def test_the_certificate_policy_keeps_uncertified_keys_and_ungranted_models_out() -> None:
    clock = FakeClock()
    verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall)
    rep = Replica(clock, policy=CertRecordPolicy(verifier))
    good, bare, greedy = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    ok = RecordOwner(good, NodeMeta(cert=_cert(good, clock, models=("llama",), max_sessions=2),
                                    models=(ServedModel("llama"),)), wall=clock.wall())
    assert rep.apply(ok.current) is not None
    assert rep.apply(RecordOwner(bare, NodeMeta(), wall=clock.wall()).current) is None
    assert rep.rejected["cert"] == 1
    squat = NodeMeta(cert=_cert(greedy, clock, models=("llama",)),
                     models=(ServedModel("llama", aliases=("gpt-4o",)),))
    assert rep.apply(RecordOwner(greedy, squat, wall=clock.wall()).current) is None
    assert rep.rejected["cert_models"] == 1
    # max_sessions in the certificate caps the key's sessions below the fabric default
    meta = ok.record.meta
    assert rep.apply(RecordOwner(good, meta, wall=clock.wall()).current) is not None
    assert rep.apply(RecordOwner(good, meta, wall=clock.wall()).current) is None
    assert rep.rejected["sessions_per_peer"] == 1
    # an expired certificate stops new records, but leaving is always accepted
    await clock.advance(3601)
    assert rep.apply(ok.refresh(wall=clock.wall())) is None
    assert rep.rejected["cert"] == 2
    change = rep.apply(ok.set_state(Lifecycle.LEFT, wall=clock.wall()))
    assert change is not None and change.after.state is Lifecycle.LEFT


def test_an_alias_squatting_another_provider_s_model_id_is_not_routed_unless_asked() -> None:
    clock = FakeClock()
    real, squatter = NodeKey.generate(), NodeKey.generate()
    recs = [
        _record(real, clock, provider="a", models=(ServedModel("llama-3-70b"),)),
        _record(squatter, clock, provider="b",
                models=(ServedModel("tiny-model", aliases=("llama-3-70b",)),)),
    ]
    source = RecordsCandidateSource(lambda: [(r, False) for r in recs])
    cands = source.candidates("llama-3-70b")
    assert {c.peer_id: c.alias_conflict for c in cands} == {real.peer_id: False,
                                                            squatter.peer_id: True}
    kept = eligible(cands, route_request("llama-3-70b"))
    assert [c.peer_id for c in kept] == [real.peer_id]
    asked = eligible(cands, route_request("llama-3-70b", providers_header=squatter.peer_id))
    assert [c.peer_id for c in asked] == [squatter.peer_id]
    # its own model id still routes normally
    assert [c.peer_id for c in eligible(source.candidates("tiny-model"),
                                        route_request("tiny-model"))] == [squatter.peer_id]


def test_certificates_without_grants_verify_as_before() -> None:
    from llmfabric.identity.admission import MembershipCert

    key = NodeKey.generate()
    cert = sign_membership(OPERATOR, key.peer_id, NET, 2e9)
    legacy = MembershipCert.signed_bytes(key.peer_id, NET, 2e9)
    assert OPERATOR.public_bytes and cert.signature == OPERATOR.sign(legacy)
    back = MembershipCert.from_json(cert.to_json())
    back.verify(OPERATOR.public_bytes, peer_id=key.peer_id, network=NET, now=1e9)
    granted = sign_membership(OPERATOR, key.peer_id, NET, 2e9, provider="x", models=("m",))
    tampered = dataclasses.replace(MembershipCert.from_json(granted.to_json()), provider="y")
    with pytest.raises(Exception, match="invalid"):
        tampered.verify(OPERATOR.public_bytes, peer_id=key.peer_id, network=NET, now=1e9)


def test_a_record_certificate_not_valid_yet_is_refused_until_its_not_before() -> None:
    """A refusal was cached for good: a certificate whose not_before had not come yet would
    have stayed refused after it came."""
    clock = FakeClock()
    wall = [clock.wall()]
    verifier = ProviderVerifier(OPERATOR.public_bytes, NET, lambda: wall[0])
    key = NodeKey.generate()
    cert = sign_membership(OPERATOR, key.peer_id, NET, clock.wall() + 3600,
                           not_before=clock.wall() + 60).to_json()
    rec = _record(key, clock, provider="p", cert=cert)
    grant, why = verifier.grant(rec)
    assert grant is None and "not valid yet" in why
    wall[0] += 61
    grant, why = verifier.grant(rec)
    assert grant is not None and why == ""


def test_a_revoked_key_s_records_are_refused_and_match_no_allowlist() -> None:
    """A leaked member key kept publishing records (routable, its provider name trusted)
    until its certificate expired."""
    from llmfabric.identity.revocation import Revocations, sign_revocations

    clock = FakeClock()
    revs = Revocations(OPERATOR.public_bytes, NET)
    verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall, revs)
    policy = CertRecordPolicy(verifier)
    leaked, narrowed, honest = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    broad = _cert(narrowed, clock, provider="lab")
    recs = {k.peer_id: _record(k, clock, provider="lab", cert=c) for k, c in (
        (leaked, _cert(leaked, clock, provider="lab")), (narrowed, broad),
        (honest, _cert(honest, clock, provider="lab")))}
    assert all(policy.refuse(r, clock.wall()) is None for r in recs.values())
    from llmfabric.identity.admission import MembershipCert

    revs.offer(sign_revocations(OPERATOR, NET, clock.wall(), [leaked.peer_id],
                                [MembershipCert.from_json(broad).cert_id]))
    for peer in (leaked.peer_id, narrowed.peer_id):
        assert policy.refuse(recs[peer], clock.wall()) == "revoked"
        assert verifier.identity(recs[peer]) == ""
        down = dataclasses.replace(recs[peer], state=Lifecycle.DOWN)
        assert policy.refuse(down, clock.wall()) == "revoked"  # not even a leaving record
    assert policy.refuse(recs[honest.peer_id], clock.wall()) is None
    assert verifier.identity(recs[honest.peer_id]) == "lab"
