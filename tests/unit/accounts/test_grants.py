"""Key grants carried in the registry: what an issuer publishes and whom a receiver trusts."""

from __future__ import annotations

import pytest

from llmfabric.accounts.grants import GRANT_BUDGET_BYTES, RemoteGrants, grants_of
from llmfabric.accounts.models import ApiKey
from llmfabric.identity.keys import NodeKey
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import KeyGrant, Lifecycle, NodeMeta, NodeRecord


def _key(i: int, admin: bool = False, revoked_at: float | None = None) -> ApiKey:
    return ApiKey(id=f"k{i:015x}", name="n", owner="alice", admin=admin, created_at=float(i),
                  revoked_at=revoked_at, hash=f"{i:064x}")


def test_issuers_publish_hashes_of_active_non_admin_keys_within_a_budget() -> None:
    keys = [_key(i) for i in range(500)]
    keys.append(_key(900, admin=True))
    keys.append(_key(901, revoked_at=5.0))
    grants = grants_of(keys)
    assert 0 < len(grants) < 500
    assert all(g.id not in {f"k{900:015x}", f"k{901:015x}"} for g in grants)
    assert len(grants) * 165 <= GRANT_BUDGET_BYTES
    newest = {f"k{i:015x}" for i in range(500 - len(grants), 500)}
    assert {g.id for g in grants} == newest  # the newest keys get the budget
    assert grants == grants_of(list(reversed(keys)))  # order-independent (compared for change)


def _record(key: NodeKey, grants: tuple[KeyGrant, ...], roles: tuple[str, ...] = ("ingress",)
            ) -> NodeRecord:
    own = RecordOwner(key, NodeMeta(roles=roles, keys=grants), wall=0.0)
    return own.set_state(Lifecycle.SERVING, wall=0.0).record


@pytest.mark.hostile
def test_only_trusted_issuers_grants_count() -> None:
    issuer, member = NodeKey.generate(), NodeKey.generate()
    good = KeyGrant("k" + "1" * 15, "a" * 64, "alice")
    forged = KeyGrant("k" + "2" * 15, "b" * 64, "mallory")
    records = [_record(issuer, (good,)),
               _record(member, (forged,)),  # a member that is not a trusted issuer
               _record(member, (forged,), roles=())]
    version = [0]
    remote = RemoteGrants(lambda: records, lambda: version[0], lambda r: r.peer_id,
                          [issuer.peer_id])
    hit = remote.lookup(good.id)
    assert hit is not None and hit.owner == "alice" and not hit.admin and hit.hash == good.hash
    assert remote.lookup(forged.id) is None
    # revoked at the issuer: its next record no longer grants it, and it is refused at once
    records[0] = _record(issuer, ())
    version[0] += 1
    assert remote.lookup(good.id) is None
    assert RemoteGrants(lambda: records, lambda: 0, lambda r: r.peer_id, []).lookup(
        forged.id) is None  # no issuers configured: nothing remote


@pytest.mark.hostile
def test_a_key_id_granted_by_two_issuers_is_refused_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """Grants are public: trusted issuer C copies A's grant (same id and hash) under another
    owner. Whichever record came first, the key would otherwise take C as its issuer and
    shed A's budgets. It is refused instead, loudly, until one of them stops granting it."""
    a, c = NodeKey.generate(), NodeKey.generate()
    real = KeyGrant("k" + "3" * 15, "c" * 64, "alice")
    copy = KeyGrant(real.id, real.hash, "nobody")
    other = KeyGrant("k" + "4" * 15, "d" * 64, "carol")
    for records in ([_record(c, (copy, other)), _record(a, (real,))],
                    [_record(a, (real,)), _record(c, (copy, other))]):
        remote = RemoteGrants(lambda records=records: records, lambda: 0,
                              lambda r: r.peer_id, [a.peer_id, c.peer_id])
        with caplog.at_level("WARNING", logger="llmfabric.accounts.grants"):
            assert remote.lookup(real.id) is None
        assert f"key {real.id} is granted by several issuers" in caplog.text
        hit = remote.lookup(other.id)  # C's own key is unaffected
        assert hit is not None and hit.issuer == c.peer_id
    records = [_record(a, (real,)), _record(c, (other,))]  # C stops copying it
    hit = RemoteGrants(lambda: records, lambda: 0, lambda r: r.peer_id,
                       [a.peer_id, c.peer_id]).lookup(real.id)
    assert hit is not None and hit.issuer == a.peer_id and hit.owner == "alice"
