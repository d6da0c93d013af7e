"""Control requests (assign/release) signed by the controller's node key.

    X-Fabric-Signed: <public key hex>.<expiry ms>.<Ed25519 signature hex>
    signed message: "llmfabric-control-v1" \\n path \\n expiry \\n sha256(body)

The receiver derives the controller's peer id from the key it verified, so a relay's origin
header is never what decides who asked. Control requests are rare: Ed25519's cost is fine.
"""

from __future__ import annotations

import hashlib

from llmfabric.dataplane.authz import AuthzError, ReplayCache
from llmfabric.identity import NodeKey, is_valid, peer_id_from_public_key

SIGNED_HEADER = "x-fabric-signed"
_LABEL = b"llmfabric-control-v1"
CONTROL_TTL_S = 60.0


def _message(path: str, exp_ms: int, body: bytes) -> bytes:
    return b"%b\n%b\n%d\n%b" % (_LABEL, path.encode(), exp_ms, hashlib.sha256(body).digest())


def sign_control(key: NodeKey, path: str, body: bytes, now: float,
                 ttl_s: float = CONTROL_TTL_S) -> str:
    exp_ms = int((now + ttl_s) * 1000)
    sig = key.sign(_message(path, exp_ms, body))
    return f"{key.public_bytes.hex()}.{exp_ms}.{sig.hex()}"


def verify_control(header: str | None, path: str, body: bytes, now: float,
                   replay: ReplayCache | None = None) -> str:
    """The signer's peer id; AuthzError when unsigned, forged, expired or replayed."""
    if not header:
        raise AuthzError("unsigned", "control requests must be signed by the controller")
    try:
        pub_hex, exp_s, sig_hex = header.split(".")
        pub, exp_ms, sig = bytes.fromhex(pub_hex), int(exp_s), bytes.fromhex(sig_hex)
    except ValueError:
        raise AuthzError("bad_signature", "malformed control signature") from None
    exp = exp_ms / 1000
    if not now <= exp <= now + 2 * CONTROL_TTL_S:
        raise AuthzError("expired", "the control request's signature expired")
    if len(pub) != 32 or not is_valid(pub, _message(path, exp_ms, body), sig):
        raise AuthzError("bad_signature", "the control request's signature does not verify")
    if replay is not None:
        replay.add(sig, exp, now)
    return peer_id_from_public_key(pub)
