"""Third-party facts about a session, signed by their author (an admitted member).

- SUSPECT(session, incarnation): the author's probes of the session all failed while its
  record had `incarnation`. The owner refutes it by publishing a record with a higher
  incarnation. Suspicion is reversible: it only takes the session out of routing.
- EVICT(session, incarnation): the suspicion timed out unrefuted, so the membership protocol
  decided the session is gone. Eviction is irreversible: the session's effective lifecycle
  becomes LEFT forever, whatever the owner writes afterwards (the owner must rejoin under a
  new session id).

Facts are small, signed over a canonical msgpack body with their own domain prefix, and travel
with the body bytes like records do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import msgpack

from llmfabric.registry.codec import unpack_limited
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.signing import Signer, peer_id_matches, verify_signature

FACT_DOMAIN = b"llmfabric/fact/v1\x00"
MAX_FACT_BYTES = 1024


class FactKind(IntEnum):  # append-only
    SUSPECT = 1
    EVICT = 2


@dataclass(frozen=True, slots=True)
class Fact:
    kind: FactKind
    session_id: str
    incarnation: int
    author: str  # peer id of the author; derives from author_key
    author_key: bytes
    issued_at: float  # author's wall clock
    body: bytes
    signature: bytes

    def order_key(self) -> tuple[int, bytes]:
        return (self.incarnation, self.signature)


def make_fact(
    signer: Signer, kind: FactKind, session_id: str, incarnation: int, issued_at: float
) -> Fact:
    body = bytes(
        msgpack.packb(
            {
                "a": signer.peer_id,
                "f": int(kind),
                "i": int(incarnation),
                "k": signer.public_bytes,
                "s": session_id,
                "t": float(issued_at),
            },
            use_bin_type=True,
        )
    )
    sig = signer.sign(FACT_DOMAIN + body)
    return Fact(kind, session_id, int(incarnation), signer.peer_id, signer.public_bytes,
                float(issued_at), body, sig)


def verify_fact(body: bytes, signature: bytes) -> Fact:
    """Decode and verify a signed fact; raise InvalidRecord(reason) if anything is off."""
    d = unpack_limited(body, MAX_FACT_BYTES)
    if not isinstance(d, dict):
        raise InvalidRecord("schema", "a fact is a map")
    try:
        kind = FactKind(int(d.get("f", -1)))
    except (ValueError, TypeError):
        raise InvalidRecord("schema", "unknown fact kind") from None
    sid, author, key, inc, t = d.get("s"), d.get("a"), d.get("k"), d.get("i"), d.get("t")
    if not (isinstance(sid, str) and len(sid) <= 64 and isinstance(author, str)
            and len(author) <= 128 and isinstance(key, bytes) and len(key) == 32
            and isinstance(inc, int) and not isinstance(inc, bool) and 0 <= inc < 2**63
            and isinstance(t, float | int) and not isinstance(t, bool) and t == t):
        raise InvalidRecord("schema", "fact fields have wrong types")
    if not peer_id_matches(author, key):
        raise InvalidRecord("peer_id", f"fact author {author} does not derive from its key")
    if not verify_signature(key, FACT_DOMAIN + body, signature):
        raise InvalidRecord("signature", f"bad signature on fact by {author}")
    return Fact(kind, sid, inc, author, key, float(t), body, signature)
