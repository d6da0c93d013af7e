import json
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
    assert b.check(proof, c) == ""  # (a PSK vouches for no member beyond the key)
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
    # the member it vouches for (relay fair shares): the peer id when it names no provider
    assert adm.check(adm.prove(ctx(node.peer_id, "zV")), ctx(node.peer_id, "zV")) == node.peer_id
    named = CertAdmission(operator.public_bytes, sign_membership(
        operator, node.peer_id, "net", NOW + 3600, provider="acme"))
    assert named.check(named.prove(ctx(node.peer_id, "zV")), ctx(node.peer_id, "zV")) == "acme"
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


def _signed_with_expiry(operator: NodeKey, peer_id: str, expires_at: float) -> MembershipCert:
    """A certificate the operator's key really signed with this expiry (as a script calling
    the key directly, or `sign-node --expires nan` before it was refused, would make)."""
    sig = operator.sign(MembershipCert.signed_bytes(peer_id, "net", expires_at))
    return MembershipCert(peer_id, "net", expires_at, operator.public_bytes, sig)


@pytest.mark.hostile
@pytest.mark.parametrize("expiry", [float("nan"), float("inf")])
def test_a_certificate_without_a_finite_expiry_never_admits(operator: NodeKey,
                                                             expiry: float) -> None:
    """NaN compared as never expired: such a certificate admitted its key forever."""
    node = NodeKey.generate()
    cert = _signed_with_expiry(operator, node.peer_id, expiry)
    with pytest.raises(AdmissionError):
        cert.verify(operator.public_bytes, peer_id=node.peer_id, network="net", now=NOW)
    with pytest.raises(AdmissionError):  # nor does its JSON ("NaN", "Infinity") load
        MembershipCert.from_json(cert.to_json())
    with pytest.raises(AdmissionError, match="finite"):
        sign_membership(operator, node.peer_id, "net", expiry)


@pytest.mark.hostile
@pytest.mark.parametrize("proof", [
    b"[" * 3000,  # nested past the recursion limit: RecursionError escaped the handshake
    b'{"v":1,"peer_id":"z","network":"net","operator":"","signature":"","expires_at":1'
    + b"0" * 400 + b"}",  # an int float() cannot hold: OverflowError escaped
    b'{"v":1,"peer_id":"z","network":"net","operator":"","signature":"","expires_at":1,'
    b'"models":["' + b"m" * 8000 + b'"]}',  # longer than any record can carry: not parsed
])
def test_a_malformed_certificate_is_an_admission_error(operator: NodeKey, proof: bytes) -> None:
    node = NodeKey.generate()
    adm = CertAdmission(operator.public_bytes,
                        sign_membership(operator, node.peer_id, "net", NOW + 3600))
    with pytest.raises(AdmissionError, match="malformed"):
        adm.check(proof, ctx(NodeKey.generate().peer_id, node.peer_id))


def test_a_certificate_too_long_for_a_record_is_not_signed(operator: NodeKey) -> None:
    with pytest.raises(AdmissionError, match="fewer or shorter models"):
        sign_membership(operator, NodeKey.generate().peer_id, "net", NOW + 3600,
                        models=tuple(f"org/model-{i}-{'x' * 100}" for i in range(40)))


@pytest.mark.hostile
def test_a_certificate_is_not_valid_before_its_not_before(operator: NodeKey) -> None:
    """Without a not_before, a verifier whose clock ran far behind (or was set back) took
    any certificate of the key as valid, however long before it was issued."""
    node = NodeKey.generate()
    cert = sign_membership(operator, node.peer_id, "net", NOW + 3600, not_before=NOW - 60)
    adm = CertAdmission(operator.public_bytes, cert)
    proof = cert.to_json().encode()
    adm.check(proof, ctx(node.peer_id, "zV", now=NOW))
    with pytest.raises(AdmissionError, match="not valid yet"):
        adm.check(proof, ctx(node.peer_id, "zV", now=NOW - 3600))
    # The bound is signed: dropping it from the JSON breaks the signature.
    unbounded = MembershipCert.from_json(proof.replace(b',"not_before":', b',"x":'))
    assert unbounded.not_before == 0.0
    with pytest.raises(AdmissionError, match="signature"):
        unbounded.verify(operator.public_bytes, peer_id=node.peer_id, network="net",
                         now=NOW - 3600)
    assert MembershipCert.from_json(cert.to_json()) == cert


def test_a_certificate_without_not_before_still_loads_and_admits(operator: NodeKey) -> None:
    node = NodeKey.generate()
    cert = sign_membership(operator, node.peer_id, "net", NOW + 3600)
    assert "not_before" not in cert.to_json()  # signed exactly as before the field existed
    body = json.dumps({"expires_at": round(NOW + 3600, 3), "network": "net",
                       "peer_id": node.peer_id}, sort_keys=True, separators=(",", ":"))
    sig = operator.sign(b"llmfabric-membership-v1\x00" + body.encode())
    assert sig == cert.signature
    MembershipCert.from_json(cert.to_json()).verify(
        operator.public_bytes, peer_id=node.peer_id, network="net", now=0.0)


@pytest.mark.hostile
@pytest.mark.parametrize("value", ['"5"', "true", "-1", "1e400", "null"])
def test_a_mistyped_not_before_does_not_load(operator: NodeKey, value: str) -> None:
    node = NodeKey.generate()
    text = sign_membership(operator, node.peer_id, "net", NOW + 3600).to_json()
    with pytest.raises(AdmissionError, match="not_before"):
        MembershipCert.from_json(text[:-1] + f',"not_before":{value}}}')
    with pytest.raises(AdmissionError, match="before the expiry"):
        sign_membership(operator, node.peer_id, "net", NOW, not_before=NOW + 1)


def test_certificate_ids_differ_per_certificate(operator: NodeKey) -> None:
    node = NodeKey.generate()
    a = sign_membership(operator, node.peer_id, "net", NOW + 3600)
    b = sign_membership(operator, node.peer_id, "net", NOW + 7200)
    assert a.cert_id != b.cert_id and len(a.cert_id) == 64
    assert MembershipCert.from_json(a.to_json()).cert_id == a.cert_id
