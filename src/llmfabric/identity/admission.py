"""Network admission: a node joins only with a credential, and each side checks the other's.

Two kinds, registered by name in `ADMISSION_KINDS`:

- ``psk``: the network's pre-shared secret, proven by challenge-response. Each side sends
  HMAC-SHA256(secret, label || role || network || prover id || verifier id || client nonce ||
  server nonce). Both nonces are fresh per connection and the role is bound in, so a proof can
  be neither replayed nor reflected; the secret itself never crosses the wire.
- ``cert``: a membership certificate. The operator's Ed25519 key signs (node peer id, network
  name, expiry, optionally a not-before time); the node presents it and the verifier checks
  the operator signature against its configured operator public key, that the certificate
  names the authenticated peer id (already proven by TLS or the handshake signature), the
  right network, is valid now (not before `not_before`, not after `expires_at`) and is not
  revoked by the operator's revocation list (identity/revocation.py), when one is set.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmfabric.identity.errors import AdmissionError, InvalidSignature
from llmfabric.identity.keys import NodeKey, is_valid

if TYPE_CHECKING:
    from llmfabric.identity.revocation import Revocations

_PSK_LABEL = b"llmfabric-psk-v1\x00"
_CERT_LABEL = b"llmfabric-membership-v1\x00"
# A certificate's JSON at most (a record carries it: registry/codec.py MAX_CERT): it names up
# to a few dozen models. Longer text is refused before it is parsed.
MAX_CERT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class AdmissionContext:
    """What a proof is bound to. `prover_role` is "client" (dialler) or "server"."""

    network: str
    prover_id: str
    verifier_id: str
    prover_role: str
    client_nonce: bytes
    server_nonce: bytes
    now: float  # verifier's wall clock, Unix seconds (for certificate expiry)


class Admission(Protocol):
    """A credential: proves this node's membership and checks a peer's proof."""

    @property
    def kind(self) -> str: ...

    @property
    def network(self) -> str: ...

    def prove(self, ctx: AdmissionContext) -> bytes: ...

    def check(self, proof: bytes, ctx: AdmissionContext) -> str:
        """Raise AdmissionError (with the reason) unless `proof` admits ctx.prover_id; else
        return the member the credential vouches for beyond the key ("" when it names none:
        a PSK proves only that the key holds the network secret)."""
        ...


def _psk_mac(secret: bytes, ctx: AdmissionContext) -> bytes:
    parts = [
        _PSK_LABEL,
        ctx.prover_role.encode(),
        b"\x00",
        ctx.network.encode(),
        b"\x00",
        ctx.prover_id.encode(),
        b"\x00",
        ctx.verifier_id.encode(),
        b"\x00",
        ctx.client_nonce,
        ctx.server_nonce,
    ]
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


class PskAdmission:
    """Admission by a network pre-shared secret (at least 16 bytes).

    Rotation without stopping the fabric: a node may hold the new secret and the previous
    one. It then proves with both (two MACs) and accepts a proof made with either, so nodes
    that already moved and nodes that have not yet still admit each other; once every node
    holds the new secret, the previous one is dropped. `set_secrets` swaps them in place
    (the node re-reads its secret file on SIGHUP); handshakes after the swap use them."""

    kind = "psk"

    def __init__(self, network: str, secret: bytes, previous: bytes | None = None) -> None:
        self._network = network
        self.set_secrets(secret, previous)

    def set_secrets(self, secret: bytes, previous: bytes | None = None) -> None:
        for s in (secret, previous or secret):
            if len(s) < 16:
                raise AdmissionError(
                    "the network secret must have at least 16 bytes; use a random one")
        self._secrets = (secret, previous) if previous and previous != secret else (secret,)

    @property
    def network(self) -> str:
        return self._network

    def prove(self, ctx: AdmissionContext) -> bytes:
        return b"".join(_psk_mac(s, ctx) for s in self._secrets)

    def check(self, proof: bytes, ctx: AdmissionContext) -> str:
        if len(proof) in (32, 64):
            for i in range(0, len(proof), 32):
                for s in self._secrets:
                    if hmac.compare_digest(proof[i : i + 32], _psk_mac(s, ctx)):
                        return ""  # (every holder of the secret mints keys: no member)
        raise AdmissionError(
            "pre-shared secret proof does not match: the peer uses another network secret"
        )


@dataclass(frozen=True, slots=True)
class MembershipCert:
    """The operator's signature over (peer id, network, expiry) and, optionally, the provider
    the peer belongs to, the models it may publish and how many sessions it may hold.

    The optional grants are signed only when set, so certificates without them verify
    exactly as before they existed."""

    peer_id: str
    network: str
    expires_at: float  # Unix seconds
    operator_public_key: bytes  # raw Ed25519
    signature: bytes
    provider: str = ""  # the provider identity routing allowlists match ("" = the peer id)
    models: tuple[str, ...] = ()  # model ids and aliases it may publish (() = any)
    max_sessions: int = 0  # sessions it may hold at once (0 = the fabric's default cap)
    not_before: float = 0.0  # Unix seconds it is valid from (0 = no lower bound, old certs)

    @staticmethod
    def signed_bytes(
        peer_id: str, network: str, expires_at: float, provider: str = "",
        models: tuple[str, ...] = (), max_sessions: int = 0, not_before: float = 0.0,
    ) -> bytes:
        fields: dict[str, object] = {
            "peer_id": peer_id, "network": network, "expires_at": round(expires_at, 3)}
        if provider:
            fields["provider"] = provider
        if models:
            fields["models"] = list(models)
        if max_sessions:
            fields["max_sessions"] = max_sessions
        if not_before:
            fields["not_before"] = round(not_before, 3)
        body = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return _CERT_LABEL + body.encode()

    def to_json(self) -> str:
        obj: dict[str, object] = {
            "v": 1,
            "peer_id": self.peer_id,
            "network": self.network,
            "expires_at": round(self.expires_at, 3),
            "operator": base64.b64encode(self.operator_public_key).decode(),
            "signature": base64.b64encode(self.signature).decode(),
        }
        if self.provider:
            obj["provider"] = self.provider
        if self.models:
            obj["models"] = list(self.models)
        if self.max_sessions:
            obj["max_sessions"] = self.max_sessions
        if self.not_before:
            obj["not_before"] = round(self.not_before, 3)
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))

    def _signed(self) -> bytes:
        return self.signed_bytes(self.peer_id, self.network, self.expires_at, self.provider,
                                 self.models, self.max_sessions, self.not_before)

    @property
    def cert_id(self) -> str:
        """The certificate's id (hex SHA-256 of what the operator signed): what a revocation
        list names to revoke this certificate and no other of the same key."""
        return hashlib.sha256(self._signed()).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes) -> MembershipCert:
        if len(text) > MAX_CERT_BYTES:
            raise AdmissionError(f"malformed membership certificate: over {MAX_CERT_BYTES} bytes")
        try:
            obj = json.loads(text)
            if obj.get("v") != 1:
                raise ValueError(f"unsupported membership certificate version {obj.get('v')!r}")
            models = obj.get("models", [])
            max_sessions = obj.get("max_sessions", 0)
            if not (isinstance(models, list) and all(isinstance(m, str) for m in models)
                    and len(models) <= 256):
                raise ValueError("models must be a list of at most 256 strings")
            if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or not (
                    0 <= max_sessions <= 1 << 20):
                raise ValueError("max_sessions must be an integer in [0, 2**20]")
            expires_at = float(obj["expires_at"])
            if not math.isfinite(expires_at):  # NaN never compares as expired
                raise ValueError("expires_at must be a finite number")
            not_before = obj.get("not_before", 0.0)  # (absent in older certificates)
            if isinstance(not_before, bool) or not isinstance(not_before, int | float) or not (
                    math.isfinite(not_before) and not_before >= 0):
                raise ValueError("not_before must be a finite number of Unix seconds")
            return cls(
                peer_id=str(obj["peer_id"]),
                network=str(obj["network"]),
                expires_at=expires_at,
                operator_public_key=base64.b64decode(obj["operator"], validate=True),
                signature=base64.b64decode(obj["signature"], validate=True),
                provider=str(obj.get("provider", "")),
                models=tuple(models),
                max_sessions=max_sessions,
                not_before=float(not_before),
            )
        # (RecursionError: JSON nested too deep; OverflowError: an integer float() cannot hold)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError,
                OverflowError) as exc:
            raise AdmissionError(f"malformed membership certificate: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MembershipCert:
        try:
            return cls.from_json(pathlib.Path(path).read_text())
        except OSError as exc:
            raise AdmissionError(f"cannot read membership certificate {path}: {exc}") from exc

    def verify(self, operator_public_key: bytes, *, peer_id: str, network: str, now: float) -> None:
        """Raise AdmissionError with the reason unless the certificate admits `peer_id`."""
        if self.operator_public_key != operator_public_key:
            raise AdmissionError("membership certificate is signed by another operator key")
        if not is_valid(operator_public_key, self._signed(), self.signature):
            raise AdmissionError("membership certificate signature is invalid (tampered?)")
        if self.peer_id != peer_id:
            raise AdmissionError(
                f"membership certificate is for peer {self.peer_id}, not for {peer_id}"
            )
        if self.network != network:
            raise AdmissionError(
                f"membership certificate is for network {self.network!r}, not {network!r}"
            )
        # NaN compares as never expired: a non-finite expiry admits nobody.
        if not (math.isfinite(self.expires_at) and now < self.expires_at):
            raise AdmissionError(
                "membership certificate has expired; ask the operator for a new one "
                "(`llmfabric keys sign-node`)"
            )
        if now < self.not_before:  # (a verifier whose clock is far behind: a replayed old one)
            raise AdmissionError(
                f"membership certificate is not valid yet (not before {self.not_before:.0f}, "
                f"now {now:.0f}): check this node's clock"
            )


def sign_membership(
    operator: NodeKey, peer_id: str, network: str, expires_at: float, *,
    provider: str = "", models: tuple[str, ...] = (), max_sessions: int = 0,
    not_before: float = 0.0,
) -> MembershipCert:
    """Operator side: certify that `peer_id` may join `network` from `not_before` (0: no
    lower bound) until `expires_at` (as a member of `provider`, publishing only `models`,
    with at most `max_sessions` sessions)."""
    if not math.isfinite(expires_at):
        raise AdmissionError("a membership certificate needs a finite expiry")
    if not (math.isfinite(not_before) and 0 <= not_before < expires_at):
        raise AdmissionError("not_before must be a finite time before the expiry")
    expires_at, not_before = round(expires_at, 3), round(not_before, 3)
    signature = operator.sign(MembershipCert.signed_bytes(
        peer_id, network, expires_at, provider, models, max_sessions, not_before))
    cert = MembershipCert(
        peer_id=peer_id,
        network=network,
        expires_at=expires_at,
        operator_public_key=operator.public_bytes,
        signature=signature,
        provider=provider,
        models=models,
        max_sessions=max_sessions,
        not_before=not_before,
    )
    if len(cert.to_json()) > MAX_CERT_BYTES:  # no node could load it, no record carry it
        raise AdmissionError(
            f"the certificate would exceed {MAX_CERT_BYTES} bytes: name fewer or shorter models")
    return cert


class CertAdmission:
    """Admission by an operator-signed membership certificate; with `revocations`, a peer
    whose key or certificate the operator's revocation list names is refused."""

    kind = "cert"

    def __init__(self, operator_public_key: bytes, cert: MembershipCert,
                 revocations: Revocations | None = None) -> None:
        self._operator = operator_public_key
        self._cert = cert
        self.revocations = revocations

    @property
    def network(self) -> str:
        return self._cert.network

    def prove(self, ctx: AdmissionContext) -> bytes:
        return self._cert.to_json().encode()

    def check(self, proof: bytes, ctx: AdmissionContext) -> str:
        """... and return the provider the certificate names (the peer id when it names
        none: registry/provider.py's verified identity)."""
        cert = MembershipCert.from_json(proof)
        try:
            cert.verify(self._operator, peer_id=ctx.prover_id, network=ctx.network, now=ctx.now)
        except InvalidSignature as exc:  # pragma: no cover - is_valid does not raise
            raise AdmissionError(str(exc)) from exc
        if self.revocations is not None:  # (raises CertificateRevoked)
            self.revocations.check(ctx.prover_id, cert.cert_id)
        return cert.provider or ctx.prover_id


ADMISSION_KINDS: dict[str, str] = {
    "psk": "pre-shared network secret, HMAC challenge-response",
    "cert": "operator-signed membership certificate",
}


def decode_public_key(text: str) -> bytes:
    """Parse an operator public key given as base64 (as printed by `keys operator-init`)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError as exc:
        raise AdmissionError(f"operator public key is not base64: {exc}") from exc
    if len(raw) != 32:
        raise AdmissionError("operator public key must be 32 raw bytes, base64-encoded")
    return raw


def encode_public_key(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
