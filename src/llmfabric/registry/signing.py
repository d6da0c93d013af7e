"""Signing and verifying registry data with Ed25519 node keys.

A `Signer` is anything with `sign(bytes) -> bytes`, `public_bytes` (raw 32-byte Ed25519 key)
and `peer_id`; `llmfabric.identity.NodeKey` satisfies it. Peer id derivation is delegated to
`llmfabric.identity.peer_id` so registry and transport agree on what a peer id is.

Session ids are bound to the owner's key: ``session_id = 16 random hex chars + 16 hex chars of
sha256("llmfabric-session" + public_key)``. A record or fact about a session therefore cannot
be written by a key other than the owner's (finding a colliding key costs ~2^64 key
generations), which keeps the G-Map keyed by session id alone.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmfabric.identity.errors import InvalidPeerId
from llmfabric.identity.peer_id import peer_id_from_public_key as _identity_peer_id

SESSION_NONCE_HEX = 16
SESSION_TAG_HEX = 16
SESSION_ID_LEN = SESSION_NONCE_HEX + SESSION_TAG_HEX


class Signer(Protocol):
    @property
    def public_bytes(self) -> bytes: ...

    @property
    def peer_id(self) -> str: ...

    def sign(self, message: bytes) -> bytes: ...


def peer_id_from_public_key(public_key: bytes) -> str:
    """The peer id of a raw Ed25519 public key (see llmfabric.identity.peer_id)."""
    return _identity_peer_id(public_key)


def peer_id_matches(peer_id: str, public_key: bytes) -> bool:
    try:
        return peer_id_from_public_key(public_key) == peer_id
    except InvalidPeerId:  # a key of the wrong length (callers checked it is bytes)
        return False


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when `signature` is a valid Ed25519 signature of `message` by `public_key`."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _session_tag(public_key: bytes) -> str:
    return hashlib.sha256(b"llmfabric-session" + public_key).hexdigest()[:SESSION_TAG_HEX]


def new_session_id(public_key: bytes) -> str:
    """A fresh session id bound to `public_key`; call once per node start."""
    return secrets.token_hex(SESSION_NONCE_HEX // 2) + _session_tag(public_key)


def session_matches_key(session_id: str, public_key: bytes) -> bool:
    """True when `session_id` was minted for `public_key` by new_session_id."""
    return len(session_id) == SESSION_ID_LEN and session_id[SESSION_NONCE_HEX:] == _session_tag(
        public_key
    )
