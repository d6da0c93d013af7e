"""API key plaintext format and hashing.

A key reads `lf-<id>-<secret>`: `id` is 16 hex characters (the public lookup part, also the
database primary key) and `secret` 43 URL-safe base64 characters (256 random bits). Only
sha256(plaintext) is stored; with 256 bits of entropy a fast hash is safe (no dictionary to
attack), and it keeps authentication cheap on the request path.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets as _secrets

PREFIX = "lf-"
_KEY_RE = re.compile(r"^lf-([0-9a-f]{16})-([A-Za-z0-9_-]{43})\Z")


def new_key() -> tuple[str, str]:
    """A fresh (key_id, plaintext)."""
    key_id = _secrets.token_hex(8)
    return key_id, f"{PREFIX}{key_id}-{_secrets.token_urlsafe(32)}"


def parse_key_id(plaintext: str) -> str | None:
    """The id part of a well-formed key, or None if the string is not shaped like our keys."""
    m = _KEY_RE.match(plaintext)
    return m.group(1) if m else None


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def matches(plaintext: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented key with a stored hash."""
    return hmac.compare_digest(hash_key(plaintext), stored_hash)
