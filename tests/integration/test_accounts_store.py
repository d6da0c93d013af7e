"""AccountStore behaviour, the same checks on both backends: a SQLite file and a fresh
Postgres database (the `accounts_db` fixture in conftest.py; the Postgres runs skip where no
server can be started)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest

from llmfabric.accounts import (
    AccountStore,
    InvalidRequest,
    KeyNotFound,
    PermissionDenied,
    ensure_admin_key,
)
from llmfabric.testing.fake_clock import FakeClock


@pytest.fixture
async def store(accounts_db: str) -> AsyncIterator[AccountStore]:
    s = await AccountStore.open(accounts_db, clock=FakeClock(), background=False)
    yield s
    await s.aclose()


async def test_create_authenticate_revoke(store: AccountStore) -> None:
    key, plain = await store.create_key("app", "alice", requests_per_min=10)
    assert (await store.authenticate(plain)) == key
    assert await store.authenticate(plain[:-1] + ("A" if plain[-1] != "A" else "B")) is None
    assert await store.authenticate("not-a-key") is None
    revoked = await store.revoke(key.id, by=None)
    assert revoked.revoked_at is not None and not revoked.active
    assert await store.authenticate(plain) is None


async def test_a_verified_key_is_remembered_until_its_entry_changes(store: AccountStore) -> None:
    key, plain = await store.create_key("app", "alice")
    other, other_plain = await store.create_key("app2", "alice")
    for _ in range(3):  # verified once, then remembered
        assert (await store.authenticate(plain)) == key
    assert (await store.authenticate(other_plain)) == other
    forged = plain[:-1] + ("A" if plain[-1] != "A" else "B")  # same id, wrong secret
    assert await store.authenticate(forged) is None
    await store.set_owner_limits("alice", requests_per_min=5, tokens_per_min=None)
    got = await store.authenticate(plain)  # the owner's new limits, not the remembered key
    assert got is not None and got.owner_requests_per_min == 5
    await store.revoke(key.id, by=None)
    assert await store.authenticate(plain) is None
    assert (await store.authenticate(other_plain)) is not None
    await store.refresh()  # (every entry replaced: verified again)
    assert await store.authenticate(plain) is None


async def test_the_sync_lookup_answers_only_what_authenticate_verified(
        store: AccountStore) -> None:
    """authenticate_cached (the ingress's per-request fast path) never answers a key that
    authenticate() would refuse: unknown, forged, not yet verified, revoked, or changed."""
    key, plain = await store.create_key("app", "alice")
    forged = plain[:-1] + ("A" if plain[-1] != "A" else "B")
    assert store.authenticate_cached(plain) is None  # not verified yet: ask authenticate()
    assert await store.authenticate(forged) is None
    assert store.authenticate_cached(forged) is None
    assert store.authenticate_cached("not-a-key") is None
    assert (await store.authenticate(plain)) == key
    assert store.authenticate_cached(plain) == key
    await store.set_owner_limits("alice", requests_per_min=5, tokens_per_min=None)
    assert store.authenticate_cached(plain) is None  # its entry changed: verified again
    got = await store.authenticate(plain)
    assert got is not None and store.authenticate_cached(plain) == got
    await store.revoke(key.id, by=None)
    assert store.authenticate_cached(plain) is None
    assert await store.authenticate(plain) is None
    assert store.authenticate_cached(plain) is None


async def test_revoke_permissions(store: AccountStore) -> None:
    a, _ = await store.create_key("a", "alice")
    a2, _ = await store.create_key("a2", "alice")
    b, _ = await store.create_key("b", "bob")
    admin, _ = await store.create_key("root", "ops", admin=True)
    with pytest.raises(PermissionDenied):
        await store.revoke(b.id, by=a)
    assert not (await store.revoke(a2.id, by=a)).active
    assert not (await store.revoke(b.id, by=admin)).active
    with pytest.raises(KeyNotFound):
        await store.revoke("0000000000000000", by=admin)


async def test_list_and_validation(store: AccountStore) -> None:
    await store.create_key("a", "alice")
    await store.create_key("b", "bob")
    # Both were created at the same (fake) instant: ties are ordered by id, on both backends.
    listed = await store.list_keys()
    assert [k.owner for k in listed] == [k.owner for k in sorted(listed, key=lambda k: k.id)]
    assert sorted(k.owner for k in listed) == ["alice", "bob"]
    assert [k.name for k in await store.list_keys(owner="bob")] == ["b"]
    with pytest.raises(InvalidRequest):
        await store.create_key(" ", "x")
    with pytest.raises(InvalidRequest):
        await store.create_key("x", "y", tokens_per_min=0)


async def test_other_process_changes_seen(accounts_db: str) -> None:
    db = accounts_db
    ingress = await AccountStore.open(db, background=False)
    cli = await AccountStore.open(db, background=False)
    try:
        key, plain = await cli.create_key("late", "carol")
        assert await ingress.authenticate(plain) == key  # cache miss -> one DB lookup
        await cli.revoke(key.id, by=None)
        assert await ingress.authenticate(plain) is not None  # still cached
        await ingress.refresh()  # what the background task does periodically
        assert await ingress.authenticate(plain) is None
    finally:
        await ingress.aclose()
        await cli.aclose()


async def test_usage_aggregates_per_key_model_day(accounts_db: str) -> None:
    clock = FakeClock(wall_start=1_700_000_000.0)  # 2023-11-14 UTC
    async with await AccountStore.open(accounts_db, clock=clock) as s:
        await _usage_checks(s, clock)


async def _usage_checks(s: AccountStore, clock: FakeClock) -> None:
    a, _ = await s.create_key("a", "alice")
    b, _ = await s.create_key("b", "bob")
    s.record_usage(a.id, "m1", 10, 5)
    s.record_usage(a.id, "m1", 1, 2)
    s.record_usage(b.id, "m2", 100, 0)
    await clock.advance(86_400)
    s.record_usage(a.id, "m1", 7, 7)
    rows = await s.usage()
    got = {(r.owner, r.model, r.day): (r.requests, r.prompt_tokens, r.completion_tokens)
           for r in rows}
    assert got == {
        ("alice", "m1", "2023-11-14"): (2, 11, 7),
        ("bob", "m2", "2023-11-14"): (1, 100, 0),
        ("alice", "m1", "2023-11-15"): (1, 7, 7),
    }
    assert [r.day for r in await s.usage(owner="alice", since_day="2023-11-15")] == ["2023-11-15"]
    assert {r.owner for r in await s.usage(key_id=b.id)} == {"bob"}


async def test_ensure_admin_key_reuses_file(tmp_path: pathlib.Path, store: AccountStore) -> None:
    path = tmp_path / "sub" / "admin.key"
    key, plain = await ensure_admin_key(store, path)
    assert key.admin and path.read_text().strip() == plain
    assert path.stat().st_mode & 0o777 == 0o600
    again, plain2 = await ensure_admin_key(store, path)
    assert (again.id, plain2) == (key.id, plain)
    await store.revoke(key.id, by=None)
    fresh, plain3 = await ensure_admin_key(store, path)
    assert fresh.id != key.id and path.read_text().strip() == plain3
