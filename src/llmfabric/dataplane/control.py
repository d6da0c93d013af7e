"""Control requests (assign/release/role) signed by the controller's node key.

    X-Fabric-Signed: <public key hex>.<expiry ms>.<Ed25519 signature hex>
    signed message: "llmfabric-control-v2" \n target peer id \n path \n expiry \n
                    sha256(body)

The receiver derives the controller's peer id from the key it verified, so a relay's origin
header is never what decides who asked. The target's peer id is signed: a member that
receives one signed release cannot replay it to the other nodes of the model within its
validity. The receiver checks that the signer may control it before it remembers the
signature, so junk signed by anybody cannot fill the replay cache. Control requests are
rare: Ed25519's cost is fine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from llmfabric.dataplane.authz import AuthzError, ReplayCache
from llmfabric.identity import NodeKey, is_valid, peer_id_from_public_key

SIGNED_HEADER = "x-fabric-signed"
_LABEL = b"llmfabric-control-v2"
CONTROL_TTL_S = 60.0
_MAX_EXP_DIGITS = 16  # milliseconds until year 318857: longer is garbage, not a time


def _message(target: str, path: str, exp_ms: int, body: bytes) -> bytes:
    return b"%b\n%b\n%b\n%d\n%b" % (_LABEL, target.encode(), path.encode(), exp_ms,
                                      hashlib.sha256(body).digest())


def sign_control(key: NodeKey, target: str, path: str, body: bytes, now: float,
                 ttl_s: float = CONTROL_TTL_S) -> str:
    """The header value for a control request to the node with peer id `target`."""
    exp_ms = int((now + ttl_s) * 1000)
    sig = key.sign(_message(target, path, exp_ms, body))
    return f"{key.public_bytes.hex()}.{exp_ms}.{sig.hex()}"


@dataclass(frozen=True, slots=True)
class ControlSignature:
    signer: str  # the controller's peer id
    signature: bytes
    expires: float


def verify_control(header: str | None, target: str, path: str, body: bytes, now: float
                   ) -> ControlSignature:
    """The verified signature of a control request to `target` (this node); AuthzError when
    unsigned, forged, made for another node or expired. The caller checks that the signer
    may control it, then `remember`s the signature (a replay is refused there)."""
    if not header:
        raise AuthzError("unsigned", "control requests must be signed by the controller")
    try:
        pub_hex, exp_s, sig_hex = header.split(".")
        if not exp_s.isdigit() or len(exp_s) > _MAX_EXP_DIGITS:
            raise ValueError(exp_s)
        pub, exp_ms, sig = bytes.fromhex(pub_hex), int(exp_s), bytes.fromhex(sig_hex)
    except ValueError:
        raise AuthzError("bad_signature", "malformed control signature") from None
    exp = exp_ms / 1000
    if not now <= exp <= now + 2 * CONTROL_TTL_S:
        raise AuthzError("expired", "the control request's signature expired")
    if len(pub) != 32 or not is_valid(pub, _message(target, path, exp_ms, body), sig):
        raise AuthzError("bad_signature", "the control request's signature does not verify "
                         "(or was made for another node)")
    return ControlSignature(peer_id_from_public_key(pub), sig, exp)


def remember(replay: ReplayCache, signed: ControlSignature, now: float) -> None:
    """AuthzError `replayed` if this signature was seen (or `replay_cache_full`)."""
    replay.add(signed.signature, signed.expires, now)
