"""Peer ids: a multibase (base58btc, prefix 'z') multihash (sha2-256) of the raw Ed25519 key.

The layout follows the multiformats conventions so a peer id is self-describing:
``"z" + base58btc(0x12 0x20 || sha256(raw_public_key))``. Ids are 46 characters and start with
``zQm``. A peer id cannot be inverted to a key: whoever presents one must also present the
public key (in its TLS certificate or handshake), and we check that the key hashes to the id.
"""

from __future__ import annotations

import hashlib

from llmfabric.identity.errors import InvalidPeerId

_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
_MULTIHASH_SHA256 = b"\x12\x20"
RAW_KEY_LEN = 32


def b58encode(data: bytes) -> str:
    zeros = len(data) - len(data.lstrip(b"\x00"))
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_ALPHABET[rem])
    return "1" * zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        idx = _INDEX.get(ch)
        if idx is None:
            raise InvalidPeerId(f"invalid base58 character {ch!r}")
        n = n * 58 + idx
    zeros = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\x00" * zeros + body


def peer_id_from_public_key(raw_public_key: bytes) -> str:
    """Derive the peer id of a raw 32-byte Ed25519 public key."""
    if len(raw_public_key) != RAW_KEY_LEN:
        raise InvalidPeerId(
            f"an Ed25519 public key has {RAW_KEY_LEN} bytes, got {len(raw_public_key)}"
        )
    digest = hashlib.sha256(raw_public_key).digest()
    return "z" + b58encode(_MULTIHASH_SHA256 + digest)


def check_peer_id(peer_id: str) -> None:
    """Raise InvalidPeerId unless `peer_id` is well formed (does not need the key)."""
    if not peer_id.startswith("z"):
        raise InvalidPeerId(f"peer id {peer_id!r} must be multibase base58btc (start with 'z')")
    raw = b58decode(peer_id[1:])
    if len(raw) != 34 or raw[:2] != _MULTIHASH_SHA256:
        raise InvalidPeerId(f"peer id {peer_id!r} is not a sha2-256 multihash")


def matches(peer_id: str, raw_public_key: bytes) -> bool:
    """True when `raw_public_key` hashes to `peer_id`."""
    try:
        return peer_id_from_public_key(raw_public_key) == peer_id
    except InvalidPeerId:
        return False
