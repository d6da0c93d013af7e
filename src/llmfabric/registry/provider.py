"""Provider identities bound to keys: who a registry record really belongs to.

`NodeMeta.provider_id` is free text any member can set, so nothing that decides trust reads
it. The verified identity of a record is:
- on certificate networks: the provider named by the operator-signed membership certificate
  the record carries (`NodeMeta.cert`, issued with `llmfabric keys sign-node --provider`),
  or, when the certificate names none, the peer id. The certificate must name the record's
  key, this network, and be unexpired; it may also restrict the models the key publishes and
  its number of sessions (`CertRecordPolicy` refuses records that exceed them);
- on PSK networks (no operator key): the key fingerprint, i.e. the peer id (a multihash of the
  Ed25519 key). Every holder of the network secret can mint keys, so names cannot be bound.
Routing allowlists (`X-Fabric-Providers`, `metadata.providers`) match only these identities.
Certificate checks are cached per (peer id, certificate text), so routing costs no signature
verification after the first. (Lives in registry/, not identity/: registry already depends on
identity, and the replica applies the policy.)
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from llmfabric.identity.admission import MembershipCert
from llmfabric.identity.errors import AdmissionError
from llmfabric.identity.revocation import Revocations
from llmfabric.registry.records import Lifecycle, NodeRecord

CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Grant:
    """What a record's certificate lets its key do; `provider` is the verified identity."""

    provider: str
    models: tuple[str, ...] = ()  # () = any model
    max_sessions: int = 0  # 0 = the fabric's default cap


def key_fingerprint_identity(record: NodeRecord) -> str:
    """The identity of a record on a PSK network: its key fingerprint (the peer id)."""
    return record.peer_id


class ProviderVerifier:
    """Verified provider identities of records, for one network and operator key."""

    def __init__(
        self, operator_key: bytes | None, network: str, wall: Callable[[], float],
        revocations: Revocations | None = None,
    ) -> None:
        self.operator_key = operator_key
        self.network = network
        self._wall = wall
        # The operator's revocation list in force (certificate networks; identity/revocation):
        # checked on every call, after the cache, so a new list applies at once.
        self.revocations = revocations
        self._cache: OrderedDict[tuple[str, str], tuple[Grant | None, float, str, str]] = (
            OrderedDict())

    def grant(self, record: NodeRecord) -> tuple[Grant | None, str]:
        """(grant, "") if the record's key is certified, else (None, why not)."""
        if self.operator_key is None:
            return Grant(record.peer_id), ""
        grant, _, why, cert_id = self._lookup(record)
        if grant is not None and self.revocations is not None:
            revoked = self.revocations.refusal(record.peer_id, cert_id)
            if revoked is not None:
                return None, revoked
        return grant, why

    def revoked(self, record: NodeRecord) -> bool:
        """The record's key, or the (valid) certificate it carries, is on the revocation
        list."""
        if self.revocations is None or self.operator_key is None:
            return False
        cert_id = self._lookup(record)[3] if record.meta.cert else ""
        return self.revocations.refusal(record.peer_id, cert_id) is not None

    def _lookup(self, record: NodeRecord) -> tuple[Grant | None, float, str, str]:
        key = (record.peer_id, record.meta.cert)
        now = self._wall()
        hit = self._cache.get(key)
        if hit is not None and now < hit[1]:  # (a refusal holds until inf, or not_before)
            self._cache.move_to_end(key)
            return hit
        hit = self._check(record, now)
        self._cache[key] = hit
        if len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)
        return hit

    def _check(self, record: NodeRecord, now: float
               ) -> tuple[Grant | None, float, str, str]:
        if not record.meta.cert:
            return None, math.inf, "no membership certificate in the record", ""
        assert self.operator_key is not None
        cert = None
        try:
            cert = MembershipCert.from_json(record.meta.cert)
            cert.verify(self.operator_key, peer_id=record.peer_id, network=self.network,
                        now=now)
        except AdmissionError as exc:
            # Not valid yet: checked again from its not_before; any other refusal holds.
            retry = cert.not_before if cert is not None and now < cert.not_before else math.inf
            return None, retry, str(exc), ""
        return (Grant(cert.provider or record.peer_id, cert.models, cert.max_sessions),
                cert.expires_at, "", cert.cert_id)

    def identity(self, record: NodeRecord) -> str:
        """The verified provider identity; "" (matches no allowlist) if unverifiable."""
        grant, _ = self.grant(record)
        return grant.provider if grant is not None else ""


class CertRecordPolicy:
    """registry.guard.RecordPolicy for certificate networks: a record enters a replica only
    with a valid certificate for its key, publishing only the models the certificate grants;
    the certificate's `max_sessions` lowers the replica's per-peer session cap."""

    def __init__(self, verifier: ProviderVerifier) -> None:
        self._verifier = verifier

    def refuse(self, record: NodeRecord, now_wall: float) -> str | None:
        if self._verifier.revoked(record):
            return "revoked"  # (not even leaving: the node drops all it holds of the key)
        if record.state >= Lifecycle.DOWN:
            return None  # leaving is always allowed (the certificate may have expired)
        grant, _ = self._verifier.grant(record)
        if grant is None:
            return "cert"
        if grant.models:
            allowed = set(grant.models)
            for m in record.meta.models:
                if m.id not in allowed or not allowed.issuperset(m.aliases):
                    return "cert_models"
        return None

    def max_sessions(self, record: NodeRecord) -> int | None:
        grant, _ = self._verifier.grant(record)
        return grant.max_sessions or None if grant is not None else None
