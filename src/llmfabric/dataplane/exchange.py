"""The session-key exchange between an ingress and a provider (once per pair and key life).

    ingress  -> provider: offer  {pub, eph, to, nonce, sig}   (sig by the ingress node key)
    provider -> ingress:  answer {pub, eph, kid, exp, now, https_port, sig}

Both sides derive the key with HKDF-SHA256 over X25519(eph_i, eph_p), bound to the whole
transcript. The ingress checks that the answer's key hashes to the provider's peer id and
signs the transcript; the provider derives the ingress's peer id from the offer's key, so
no origin header (which a relay could forge) is ever trusted. `now` is the provider's
clock: the ingress keeps the offset and stamps expiries in provider time (no clock sync).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import msgpack
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from llmfabric.identity import NodeKey, is_valid, peer_id_from_public_key

SESSION_PATH = "/_fabric/v1/forward-session"
_OFFER = b"llmfabric-dp-offer-v1"
_ANSWER = b"llmfabric-dp-answer-v1"
MAX_MESSAGE = 1024
MAX_CLOCK_OFFSET_S = 30 * 86400.0  # a provider's clock this far off is broken, not skewed
MAX_SESSION_TTL_S = 86400.0


class ExchangeError(Exception):
    """A malformed, unsigned or misdirected exchange message."""


@dataclass(frozen=True, slots=True)
class SessionKey:
    kid: bytes  # 8 bytes, chosen by the provider
    key: bytes  # 32 bytes
    peer_id: str  # the other side
    expires: float  # provider clock (seconds)
    offset: float = 0.0  # ingress side: provider clock - local clock at the exchange
    https_port: int = 0  # ingress side: the provider's pinned-certificate HTTPS listener


@dataclass(frozen=True, slots=True)
class Offer:
    message: bytes
    secret: X25519PrivateKey
    eph: bytes
    nonce: bytes
    to: str
    me: str  # the ingress's own peer id


def _raw(pub: X25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _derive(shared: bytes, nonce: bytes, transcript: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=nonce, info=transcript).derive(shared)


def _load(message: bytes, fields: tuple[str, ...]) -> dict[str, object]:
    if len(message) > MAX_MESSAGE:
        raise ExchangeError("exchange message too large")
    try:
        doc = msgpack.unpackb(message, raw=False)
    except Exception as exc:
        raise ExchangeError(f"exchange message is not msgpack: {exc}") from None
    if not isinstance(doc, dict) or any(f not in doc for f in fields):
        raise ExchangeError(f"exchange message needs {', '.join(fields)}")
    return doc


def _bytes(doc: dict[str, object], name: str, size: int) -> bytes:
    v = doc[name]
    if not isinstance(v, bytes) or len(v) != size:
        raise ExchangeError(f"{name} must be {size} bytes")
    return v


def offer(key: NodeKey, provider_peer_id: str) -> Offer:
    secret = X25519PrivateKey.generate()
    eph = _raw(secret.public_key())
    nonce = os.urandom(16)
    to = provider_peer_id.encode()
    sig = key.sign(_OFFER + to + eph + nonce)
    message = msgpack.packb({"pub": key.public_bytes, "eph": eph, "to": provider_peer_id,
                             "nonce": nonce, "sig": sig})
    return Offer(message, secret, eph, nonce, provider_peer_id, key.peer_id)


def _answer_transcript(ingress_id: str, eph_i: bytes, nonce: bytes, eph_p: bytes, kid: bytes,
                       exp: float, now: float, https_port: int) -> bytes:
    return (_ANSWER + ingress_id.encode() + eph_i + nonce + eph_p + kid
            + struct.pack(">ddH", exp, now, https_port))


def answer(key: NodeKey, message: bytes, now: float, *, ttl_s: float = 3600.0,
           https_port: int = 0) -> tuple[bytes, SessionKey]:
    """Provider side: check the offer, return (answer message, session for the ingress)."""
    doc = _load(message, ("pub", "eph", "to", "nonce", "sig"))
    pub, eph_i = _bytes(doc, "pub", 32), _bytes(doc, "eph", 32)
    nonce, sig = _bytes(doc, "nonce", 16), _bytes(doc, "sig", 64)
    if doc["to"] != key.peer_id:
        raise ExchangeError("the offer is addressed to another node")
    if not is_valid(pub, _OFFER + key.peer_id.encode() + eph_i + nonce, sig):
        raise ExchangeError("the offer's signature does not verify")
    ingress_id = peer_id_from_public_key(pub)
    secret = X25519PrivateKey.generate()
    eph_p = _raw(secret.public_key())
    kid = os.urandom(8)
    exp = now + ttl_s
    transcript = _answer_transcript(ingress_id, eph_i, nonce, eph_p, kid, exp, now, https_port)
    try:
        shared = secret.exchange(X25519PublicKey.from_public_bytes(eph_i))
    except ValueError as exc:
        raise ExchangeError(f"bad ephemeral key: {exc}") from None
    session = SessionKey(kid, _derive(shared, nonce, transcript), ingress_id, exp)
    reply = msgpack.packb({"pub": key.public_bytes, "eph": eph_p, "kid": kid, "exp": exp,
                           "now": now, "https_port": https_port,
                           "sig": key.sign(transcript)})
    return reply, session


def finish(sent: Offer, message: bytes, local_now: float) -> SessionKey:
    """Ingress side: check the answer came from the provider the offer was for."""
    doc = _load(message, ("pub", "eph", "kid", "exp", "now", "https_port", "sig"))
    pub, eph_p = _bytes(doc, "pub", 32), _bytes(doc, "eph", 32)
    kid, sig = _bytes(doc, "kid", 8), _bytes(doc, "sig", 64)
    exp, now, port = doc["exp"], doc["now"], doc["https_port"]
    if not (isinstance(exp, float) and isinstance(now, float) and isinstance(port, int)
            and 0 <= port < 65536):
        raise ExchangeError("bad exp/now/https_port")
    # A provider's clock may be off, but not by years, nor non-finite: these values reach
    # authz's arithmetic (an inf offset raised OverflowError, which no caller retried).
    if not (math.isfinite(now) and abs(now - local_now) <= MAX_CLOCK_OFFSET_S
            and math.isfinite(exp) and now < exp <= now + MAX_SESSION_TTL_S):
        raise ExchangeError("the answer's clock (now/exp) is out of range")
    if peer_id_from_public_key(pub) != sent.to:
        raise ExchangeError("the answer is not from the provider we asked (key mismatch)")
    transcript = _answer_transcript(sent.me, sent.eph, sent.nonce, eph_p, kid, exp,
                                    now, port)
    if not is_valid(pub, transcript, sig):
        raise ExchangeError("the answer's signature does not verify")
    shared = sent.secret.exchange(X25519PublicKey.from_public_bytes(eph_p))
    return SessionKey(kid, _derive(shared, sent.nonce, transcript), sent.to, exp,
                      offset=now - local_now, https_port=port)

