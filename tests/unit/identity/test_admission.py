import os

import pytest

from llmfabric.identity import (
    AdmissionContext,
    AdmissionError,
    CertAdmission,
    MembershipCert,
    NodeKey,
    PskAdmission,
    sign_membership,
)

NOW = 1_700_000_000.0


def ctx(prover: str, verifier: str, role: str = "client", network: str = "net", now: float = NOW):
    return AdmissionContext(network, prover, verifier, role, b"c" * 32, b"s" * 32, now)


def test_psk_proof_verifies_with_same_secret_only():
    a = PskAdmission("net", b"k" * 32)
    b = PskAdmission("net", b"k" * 32)
    wrong = PskAdmission("net", b"w" * 32)
    c = ctx("zA", "zB")
    proof = a.prove(c)
    b.check(proof, c)
    with pytest.raises(AdmissionError, match="another network secret"):
        wrong.check(proof, c)


def test_psk_proof_is_bound_to_nonces_ids_and_role():
    psk = PskAdmission("net", os.urandom(32))
    c = ctx("zA", "zB")
    proof = psk.prove(c)
    for other in (
        ctx("zA", "zB", role="server"),  # reflection
        ctx("zX", "zB"),
        ctx("zA", "zX"),
        AdmissionContext("net", "zA", "zB", "client", b"d" * 32, b"s" * 32, NOW),  # replay
    ):
        with pytest.raises(AdmissionError):
            psk.check(proof, other)


def test_psk_secret_must_be_long_enough():
    with pytest.raises(AdmissionError, match="16 bytes"):
        PskAdmission("net", b"short")


@pytest.fixture
def operator():
    return NodeKey.generate()


def test_membership_cert_admits_the_named_node(operator):
    node = NodeKey.generate()
    cert = sign_membership(operator, node.peer_id, "net", NOW + 3600)
    adm = CertAdmission(operator.public_bytes, cert)
    adm.check(adm.prove(ctx(node.peer_id, "zV")), ctx(node.peer_id, "zV"))
    # Round trip through the JSON file format.
    assert MembershipCert.from_json(cert.to_json()) == cert


def test_membership_cert_rejections(operator):
    node = NodeKey.generate()
    good = sign_membership(operator, node.peer_id, "net", NOW + 3600)
    verifier = CertAdmission(operator.public_bytes, good)
    expired = sign_membership(operator, node.peer_id, "net", NOW - 1)
    with pytest.raises(AdmissionError, match="expired"):
        verifier.check(expired.to_json().encode(), ctx(node.peer_id, "zV"))
    other_net = sign_membership(operator, node.peer_id, "other", NOW + 3600)
    with pytest.raises(AdmissionError, match="network"):
        verifier.check(other_net.to_json().encode(), ctx(node.peer_id, "zV"))
    rogue = sign_membership(NodeKey.generate(), node.peer_id, "net", NOW + 3600)
    with pytest.raises(AdmissionError, match="another operator"):
        verifier.check(rogue.to_json().encode(), ctx(node.peer_id, "zV"))
    with pytest.raises(AdmissionError, match="not for"):
        verifier.check(good.to_json().encode(), ctx(NodeKey.generate().peer_id, "zV"))
    forged = MembershipCert(
        good.peer_id, good.network, good.expires_at + 1e6, good.operator_public_key, good.signature
    )
    with pytest.raises(AdmissionError, match="signature"):
        verifier.check(forged.to_json().encode(), ctx(node.peer_id, "zV"))
    with pytest.raises(AdmissionError, match="malformed"):
        verifier.check(b"{not json", ctx(node.peer_id, "zV"))
