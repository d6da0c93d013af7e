"""Revocation lists: the operator withdraws member keys (or single certificates) at once.

A revocation list is a small JSON file the operator's key signs, with the scheme of the
membership certificates (Ed25519 over a label and the canonical JSON of the parsed fields):

    {"v": 1, "network": "lab", "issued_at": 1767225600.0,
     "peer_ids": ["z6Mk..."], "cert_ids": ["<hex sha-256>"],
     "operator": "<base64 public key>", "signature": "<base64>"}

- `peer_ids` revoke every certificate of a key (a leaked member key); `cert_ids` revoke one
  certificate (`MembershipCert.cert_id`, printed by `keys sign-node`), e.g. one that granted
  too much, while the key's other certificates stay valid.
- At most `MAX_REVOKED` entries in all and `MAX_LIST_BYTES` of text; parsing is strict
  (unknown or duplicate keys, duplicate or malformed entries, a non-finite `issued_at` are
  refused with the reason).
- A list is bound to its network and verified against the node's configured operator key.
- `Revocations` holds the list in force and replaces it only with a verified list of the same
  network that is not older (`issued_at` not earlier): an old list cannot be replayed to
  withdraw a revocation. It is shared by the handshake (`CertAdmission`) and the registry's
  record check (`registry.provider.ProviderVerifier`).

`llmfabric keys revoke-node` writes lists; `llmfabric start --revocation-list FILE` reads one
and follows the file's changes (node/revocations.py); nodes pass the newest list they hold on
to each other (node/revocations.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import pathlib
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llmfabric.clock import utc_time
from llmfabric.identity.errors import AdmissionError, CertificateRevoked, InvalidPeerId
from llmfabric.identity.keys import NodeKey, is_valid
from llmfabric.identity.peer_id import check_peer_id

_LABEL = b"llmfabric-revocations-v1\x00"
MAX_REVOKED = 10_000  # peer ids and certificate ids together
MAX_LIST_BYTES = 1 << 20  # 10,000 certificate ids (66 bytes each) fit with room to spare
_CERT_ID = re.compile(r"[0-9a-f]{64}")
_KEYS = frozenset({"v", "network", "issued_at", "peer_ids", "cert_ids", "operator",
                   "signature"})


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _entries(obj: dict[str, Any], name: str) -> tuple[str, ...]:
    value = obj.get(name, [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{name} must be a list of strings")
    if len(set(value)) != len(value):
        raise ValueError(f"{name} lists an entry twice")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class RevocationList:
    network: str
    issued_at: float  # Unix seconds; a node keeps the newest list it verified
    peer_ids: frozenset[str]
    cert_ids: frozenset[str]
    operator_public_key: bytes
    signature: bytes

    @staticmethod
    def signed_bytes(network: str, issued_at: float, peer_ids: Iterable[str],
                     cert_ids: Iterable[str]) -> bytes:
        body = json.dumps({"network": network, "issued_at": round(issued_at, 3),
                           "peer_ids": sorted(peer_ids), "cert_ids": sorted(cert_ids)},
                          sort_keys=True, separators=(",", ":"))
        return _LABEL + body.encode()

    @property
    def digest(self) -> bytes:
        """8 bytes of the SHA-256 of what the operator signed: with `issued_at`, what a
        node's record advertises of the list it holds (node/revocations.py)."""
        message = self.signed_bytes(self.network, self.issued_at, self.peer_ids, self.cert_ids)
        return hashlib.sha256(message).digest()[:8]

    def to_json(self) -> str:
        return json.dumps({
            "v": 1, "network": self.network, "issued_at": round(self.issued_at, 3),
            "peer_ids": sorted(self.peer_ids), "cert_ids": sorted(self.cert_ids),
            "operator": base64.b64encode(self.operator_public_key).decode(),
            "signature": base64.b64encode(self.signature).decode(),
        }, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> RevocationList:
        if len(text) > MAX_LIST_BYTES:
            raise AdmissionError(f"malformed revocation list: over {MAX_LIST_BYTES} bytes")
        try:
            obj = json.loads(text, object_pairs_hook=_no_duplicate_keys)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            if obj.get("v") != 1:
                raise ValueError(f"unsupported revocation list version {obj.get('v')!r}")
            unknown = set(obj) - _KEYS
            if unknown:
                raise ValueError(f"unknown field(s) {sorted(unknown)}")
            network, issued_at = obj.get("network"), obj.get("issued_at")
            if not isinstance(network, str):
                raise ValueError("network must be a string")
            if isinstance(issued_at, bool) or not isinstance(issued_at, int | float) or not (
                    math.isfinite(issued_at) and issued_at > 0):
                raise ValueError("issued_at must be a positive, finite number of Unix seconds")
            # Only the milliseconds are signed (signed_bytes rounds): digits past them are
            # anyone's to add. Kept, they made a copy of a genuine list "newer" than itself
            # (a larger issued_at, the same digest): nodes that learnt it advertised a list
            # they then served rounded (to_json), and every peer backed them off as liars,
            # which could hold up the next list's spread for up to an hour.
            issued_at = round(float(issued_at), 3)
            if issued_at <= 0:
                raise ValueError("issued_at must be a positive, finite number of Unix seconds")
            peer_ids, cert_ids = _entries(obj, "peer_ids"), _entries(obj, "cert_ids")
            if len(peer_ids) + len(cert_ids) > MAX_REVOKED:
                raise ValueError(f"more than {MAX_REVOKED} entries")
            for p in peer_ids:
                if len(p) > 100:  # (a peer id is ~50 characters; base58 decoding is quadratic)
                    raise ValueError(f"peer id {p[:80]!r}... is too long")
                try:
                    check_peer_id(p)
                except InvalidPeerId as exc:
                    raise ValueError(f"peer id {p[:80]!r}: {exc}") from exc
            for c in cert_ids:
                if not _CERT_ID.fullmatch(c):
                    raise ValueError(f"certificate id {c[:80]!r} is not 64 lowercase hex "
                                     "digits")
            operator, signature = obj.get("operator"), obj.get("signature")
            if not isinstance(operator, str) or not isinstance(signature, str):
                raise ValueError("operator and signature must be base64 strings")
            return cls(network, issued_at, frozenset(peer_ids), frozenset(cert_ids),
                       base64.b64decode(operator, validate=True),
                       base64.b64decode(signature, validate=True))
        except (ValueError, TypeError, RecursionError, OverflowError) as exc:
            raise AdmissionError(f"malformed revocation list: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RevocationList:
        """Read a list file (a regular file, at most MAX_LIST_BYTES; checked on the open
        descriptor). It is not secret: any mode is fine, its signature is what counts."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise AdmissionError(f"revocation list {path} is not a regular file")
                data = fh.read(MAX_LIST_BYTES + 1)
        except OSError as exc:
            raise AdmissionError(f"cannot read revocation list {path}: {exc}") from exc
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise AdmissionError(f"malformed revocation list {path}: not UTF-8") from exc
        return cls.from_json(text)

    def verify(self, operator_public_key: bytes, network: str) -> None:
        """Raise AdmissionError unless the operator's key signed this list for `network`."""
        if self.operator_public_key != operator_public_key:
            raise AdmissionError("revocation list is signed by another operator key")
        message = self.signed_bytes(self.network, self.issued_at, self.peer_ids, self.cert_ids)
        if not is_valid(operator_public_key, message, self.signature):
            raise AdmissionError("revocation list signature is invalid (tampered?)")
        if self.network != network:
            raise AdmissionError(
                f"revocation list is for network {self.network!r}, not {network!r}")

    def revokes(self, peer_id: str, cert_id: str = "") -> bool:
        return peer_id in self.peer_ids or (bool(cert_id) and cert_id in self.cert_ids)


def sign_revocations(operator: NodeKey, network: str, issued_at: float,
                     peer_ids: Iterable[str] = (), cert_ids: Iterable[str] = ()
                     ) -> RevocationList:
    """Operator side: a signed list revoking `peer_ids` and `cert_ids` on `network`."""
    peers, certs = frozenset(peer_ids), frozenset(cert_ids)
    if not (math.isfinite(issued_at) and issued_at > 0):
        raise AdmissionError("a revocation list needs a finite issue time")
    if len(peers) + len(certs) > MAX_REVOKED:
        raise AdmissionError(f"a revocation list holds at most {MAX_REVOKED} entries")
    for p in peers:
        check_peer_id(p)
    for c in certs:
        if not _CERT_ID.fullmatch(c):
            raise AdmissionError(f"certificate id {c[:80]!r} is not 64 lowercase hex digits")
    issued_at = round(issued_at, 3)
    sig = operator.sign(RevocationList.signed_bytes(network, issued_at, peers, certs))
    rl = RevocationList(network, issued_at, peers, certs, operator.public_bytes, sig)
    if len(rl.to_json()) > MAX_LIST_BYTES:  # (no node would load it)
        raise AdmissionError(f"the revocation list would exceed {MAX_LIST_BYTES} bytes")
    return rl


class Revocations:
    """The revocation list in force for one network and operator key (None: none yet)."""

    def __init__(self, operator_public_key: bytes, network: str) -> None:
        self.operator_public_key = operator_public_key
        self.network = network
        self.current: RevocationList | None = None

    def offer(self, rl: RevocationList) -> bool:
        """Put `rl` in force if it verifies and is not older than the list in force; return
        whether it changed anything. Raise AdmissionError (the list in force stays) if not."""
        rl.verify(self.operator_public_key, self.network)
        cur = self.current
        if cur is not None and rl.issued_at < cur.issued_at:
            raise AdmissionError(
                f"revocation list issued at {utc_time(rl.issued_at)} is older than the list in "
                f"force (issued at {utc_time(cur.issued_at)}): an old list does not replace a "
                "newer one")
        self.current = rl
        return cur is None or (cur.peer_ids, cur.cert_ids) != (rl.peer_ids, rl.cert_ids)

    def refusal(self, peer_id: str, cert_id: str = "") -> str | None:
        """Why `peer_id` (holding certificate `cert_id`) is revoked, or None."""
        rl = self.current
        if rl is None or not rl.revokes(peer_id, cert_id):
            return None
        what = "key" if peer_id in rl.peer_ids else "certificate"
        return (f"the membership of peer {peer_id} is revoked: its {what} is on the "
                f"operator's revocation list (issued at {utc_time(rl.issued_at)})")

    def check(self, peer_id: str, cert_id: str = "") -> None:
        why = self.refusal(peer_id, cert_id)
        if why is not None:
            raise CertificateRevoked(why)


def read_list_file(path: pathlib.Path) -> RevocationList | None:
    """The list in `path`, or None when the file does not exist (for `keys revoke-node`,
    which creates it)."""
    if not path.exists():
        return None
    return RevocationList.load(path)
