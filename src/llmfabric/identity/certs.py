"""Self-signed X.509 certificates made from a node key, for TLS 1.3.

The certificate's subject is the peer id and its key is the node's Ed25519 key; it signs itself.
A dialler reads the server certificate, checks the self-signature with `cert_identity`, and
derives (then pins) the peer id from the certified key.
"""

from __future__ import annotations

import datetime as dt
import hashlib

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import NameOID

from llmfabric.identity.errors import InvalidPeerId, InvalidSignature
from llmfabric.identity.keys import NodeKey
from llmfabric.identity.peer_id import peer_id_from_public_key


def make_self_signed_cert(key: NodeKey, *, valid_days: int = 3650) -> bytes:
    """A DER certificate for `key`, valid from yesterday for `valid_days`."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, key.peer_id)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .sign(key.private_key, algorithm=None)
    )
    return cert.public_bytes(serialization.Encoding.DER)


def cert_pem(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def fingerprint(der: bytes) -> bytes:
    """SHA-256 of the DER certificate (bound into the client's handshake signature)."""
    return hashlib.sha256(der).digest()


def cert_identity(der: bytes) -> tuple[str, bytes]:
    """Check a peer certificate's Ed25519 self-signature; return (peer id, raw public key)."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise InvalidPeerId(f"peer certificate is not valid DER: {exc}") from exc
    public = cert.public_key()
    if not isinstance(public, Ed25519PublicKey):
        raise InvalidPeerId(
            "peer certificate key is not Ed25519: the peer is not an llmfabric node"
        )
    try:
        cert.verify_directly_issued_by(cert)
    except Exception as exc:  # cryptography raises several types here
        raise InvalidSignature(f"peer certificate self-signature is invalid: {exc}") from exc
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return peer_id_from_public_key(raw), raw
