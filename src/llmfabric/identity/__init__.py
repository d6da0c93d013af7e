"""Node identity and admission: Ed25519 node keys, peer ids, signing, TLS certificates, credentials.

Files:
- peer_id.py: peer id = multibase base58btc of a sha2-256 multihash of the raw public key.
- keys.py: `NodeKey` (generate / load_or_create with 0600 files under $LLMFABRIC_HOME or
  ~/.llmfabric), `verify`/`is_valid` for signatures.
- certs.py: self-signed X.509 certificate from a node key; `cert_identity` checks a peer's
  certificate and derives its peer id (for pinning).
- admission.py: `Admission` protocol with `PskAdmission` (HMAC challenge-response) and
  `CertAdmission` (operator-signed `MembershipCert`, optionally checked against revocations).
- revocation.py: operator-signed `RevocationList` (revoked peer ids and certificate ids) and
  `Revocations`, the list in force (never replaced by an older one).
- errors.py: `IdentityError` > KeyFileError, InvalidSignature, InvalidPeerId, AdmissionError
  (> CertificateRevoked).
"""

from llmfabric.identity.admission import (
    Admission,
    AdmissionContext,
    CertAdmission,
    MembershipCert,
    PskAdmission,
    sign_membership,
)
from llmfabric.identity.errors import (
    AdmissionError,
    IdentityError,
    InvalidPeerId,
    InvalidSignature,
    KeyFileError,
)
from llmfabric.identity.keys import NodeKey, default_home, is_valid, verify
from llmfabric.identity.peer_id import peer_id_from_public_key

__all__ = [
    "Admission",
    "AdmissionContext",
    "AdmissionError",
    "CertAdmission",
    "IdentityError",
    "InvalidPeerId",
    "InvalidSignature",
    "KeyFileError",
    "MembershipCert",
    "NodeKey",
    "PskAdmission",
    "default_home",
    "is_valid",
    "peer_id_from_public_key",
    "sign_membership",
    "verify",
]
