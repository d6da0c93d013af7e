"""API keys that reach every ingress without a central database.

An ingress that issues keys publishes, in its own signed registry record, a grant for each of
its active non-admin keys: the key id, sha256 of the plaintext (never the secret), the owner
and the key's limits (`registry.records.KeyGrant`). Another ingress started with
`--key-issuer ID` (a verified provider identity: the issuer's peer id on PSK networks, its
certificate's provider on certificate networks) accepts those keys: `RemoteGrants` indexes
the grants of trusted issuers' records and `AccountStore.authenticate` consults it after its
own cache. A revocation removes the grant from the issuer's next record, so it reaches every
ingress as fast as a record update spreads (about a second on a LAN); the remote side fails
closed (a key no longer granted is refused). Admin keys are never published. The record
carries at most `GRANT_BUDGET_BYTES` of grants (newest first; about 50 keys with short owner
names): older keys work only where they were created, as do keys with an expiry or a
model allowlist (a grant carries neither, and the remote side must not serve such a key
past its expiry or beyond its models). Remote keys get this ingress's owner
limits, not the issuer's. A key id granted by two different issuers is refused (a warning
names both): the grant says nothing the other issuer could not copy, and the key's issuer
decides whose budgets bind it, so no issuer can take over another's key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmfabric.accounts.models import ApiKey
from llmfabric.registry.records import KeyGrant, Lifecycle, NodeRecord
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

GRANT_BUDGET_BYTES = 8 * 1024
_MAX_WARNED = 4096  # key ids warned about (bounded: hostile churn)
_GRANT_OVERHEAD = 160  # msgpack size of one grant without its owner (measured: 164 B with
# owner "alice"); 8 KB of grants keeps a record well inside the 16 KB body limit


def grants_of(keys: Iterable[ApiKey]) -> tuple[KeyGrant, ...]:
    """The grants an issuer publishes for `keys` (with their hashes): active, non-admin,
    without expiry or allowlist, newest first, within the byte budget; sorted by id so
    unchanged sets compare equal."""
    out: list[KeyGrant] = []
    used = 0
    for key in sorted(keys, key=lambda k: (-k.created_at, k.id)):
        if key.admin or not key.active or not key.hash or key.expires_at is not None \
                or key.models is not None:
            continue  # (a grant carries no expiry nor allowlist: such keys stay local)
        size = _GRANT_OVERHEAD + len(key.owner.encode())
        if used + size > GRANT_BUDGET_BYTES:
            break
        used += size
        out.append(KeyGrant(key.id, key.hash, key.owner, key.requests_per_min or 0,
                            key.tokens_per_min or 0))
    return tuple(sorted(out, key=lambda g: g.id))


def key_of(grant: KeyGrant, issuer: str) -> ApiKey:
    """The ApiKey a remote grant stands for on this ingress."""
    return ApiKey(id=grant.id, name=f"(issued by {issuer})", owner=grant.owner, admin=False,
                  created_at=0.0, requests_per_min=grant.requests_per_min or None,
                  tokens_per_min=grant.tokens_per_min or None, hash=grant.hash,
                  issuer=issuer)


class RemoteGrants:
    """Key id -> (grant, issuer) from the records of trusted issuers, rebuilt when the
    replica changes (`version`)."""

    def __init__(
        self,
        records: Callable[[], Iterable[NodeRecord]],
        version: Callable[[], int],
        identify: Callable[[NodeRecord], str],
        issuers: Iterable[str],
    ) -> None:
        self._records = records
        self._version = version
        self._identify = identify
        self.issuers = frozenset(issuers)
        self._seen: int | None = None
        self._index: dict[str, tuple[KeyGrant, str]] = {}
        self._warned: set[str] = set()

    def lookup(self, key_id: str) -> ApiKey | None:
        if not self.issuers:
            return None
        v = self._version()
        if v != self._seen:
            self._index = self._build()
            self._seen = v
        hit = self._index.get(key_id)
        return None if hit is None else key_of(*hit)

    def _build(self) -> dict[str, tuple[KeyGrant, str]]:
        index: dict[str, tuple[KeyGrant, str]] = {}
        claimed: dict[str, set[str]] = {}
        for rec in self._records():
            if rec.state is Lifecycle.LEFT or not rec.meta.keys or "ingress" not in rec.meta.roles:
                continue
            who = self._identify(rec)
            if who not in self.issuers:
                continue
            for g in rec.meta.keys:
                index.setdefault(g.id, (g, who))
                claimed.setdefault(g.id, set()).add(who)
        for key_id, issuers in claimed.items():
            if len(issuers) > 1:
                del index[key_id]
                if key_id not in self._warned and len(self._warned) < _MAX_WARNED:
                    self._warned.add(key_id)
                    log.warning("key %s is granted by several issuers (%s): refused",
                                key_id, ", ".join(sorted(issuers)))
        return index
