"""A key's model allowlist in the accounts package: the policy (a key cannot mint a key that
reaches more models), the store keeping it, grants leaving restricted keys local, and an
accounts.db from before the columns existed opening and working (the migration)."""

from __future__ import annotations

import pathlib
import sqlite3
from collections.abc import AsyncIterator

import pytest

from llmfabric.accounts import AccountStore, InvalidRequest, PermissionDenied
from llmfabric.accounts.grants import grants_of
from llmfabric.accounts.keyfmt import hash_key, new_key
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.policy import check_models, models_for_new_key
from llmfabric.accounts.store import decode_models
from llmfabric.testing.fake_clock import FakeClock

NOW = 1_800_000_000.0


@pytest.fixture
async def store() -> AsyncIterator[AccountStore]:
    s = await AccountStore.open(":memory:", clock=FakeClock(wall_start=NOW), background=False)
    yield s
    await s.aclose()


def key(models: frozenset[str] | None, admin: bool = False) -> ApiKey:
    return ApiKey("k1", "app", "cs101", admin, 0.0, models=models)


@pytest.mark.hostile
def test_a_key_cannot_mint_a_key_for_more_models() -> None:
    mine = key(frozenset({"llama-8b", "qwen-7b"}))
    assert models_for_new_key(mine, None) == mine.models  # unset: inherits the creator's
    assert models_for_new_key(mine, frozenset({"qwen-7b"})) == {"qwen-7b"}
    with pytest.raises(PermissionDenied, match="gpt-big") as exc:
        models_for_new_key(mine, frozenset({"qwen-7b", "gpt-big"}))
    assert "llama-8b" not in str(exc.value)  # (names only what was asked beyond)
    assert models_for_new_key(key(None), frozenset({"x"})) == {"x"}
    assert models_for_new_key(key(frozenset({"a"}), admin=True), None) is None
    assert models_for_new_key(None, None) is None


@pytest.mark.hostile
def test_allowlists_are_validated_and_damaged_rows_fail_closed() -> None:
    assert check_models([" llama-8b ", "qwen-7b", "qwen-7b"]) == {"llama-8b", "qwen-7b"}
    for bad in ([], [""], ["  "], ["a\nb"], ["x" * 513], "llama", ["m"] * 0,
                [str(i) for i in range(257)]):
        with pytest.raises(InvalidRequest):
            check_models(bad)
    assert decode_models('["a", "b"]') == {"a", "b"}
    assert decode_models("not json") == frozenset()  # no model rather than every model
    assert decode_models('{"a": 1}') == frozenset()


@pytest.mark.hostile
async def test_the_store_keeps_the_allowlist_and_a_child_cannot_widen_it(
    store: AccountStore,
) -> None:
    parent, plain = await store.create_key("course", "cs101", models=["llama-8b", "qwen-7b"])
    assert parent.to_json()["models"] == ["llama-8b", "qwen-7b"]
    assert (await store.authenticate(plain)) == parent
    child, _ = await store.create_key("student", "cs101", by=parent)
    assert child.models == parent.models
    narrow, _ = await store.create_key("student", "cs101", models=["qwen-7b"], by=parent)
    assert narrow.models == {"qwen-7b"}
    with pytest.raises(PermissionDenied):
        await store.create_key("student", "cs101", models=["qwen-7b", "gpt-big"], by=parent)
    await store.refresh()  # read back from the database
    assert {k.id: k.models for k in store.cached_keys()}[narrow.id] == {"qwen-7b"}


async def test_restricted_keys_are_not_published_as_grants(store: AccountStore) -> None:
    free, _ = await store.create_key("a", "alice")
    await store.create_key("b", "alice", models=["m"])
    await store.create_key("c", "alice", expires_at=NOW + 60)
    assert [g.id for g in grants_of(store.cached_keys())] == [free.id]


OLD_SCHEMA = """CREATE TABLE api_keys (
    id TEXT PRIMARY KEY, key_hash TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL,
    admin INTEGER NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION, requests_per_min INTEGER, tokens_per_min INTEGER,
    record_trace INTEGER NOT NULL DEFAULT 1);
CREATE TABLE usage_daily (
    key_id TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (key_id, model, day));
CREATE TABLE owner_limits (owner TEXT PRIMARY KEY, requests_per_min INTEGER,
    tokens_per_min INTEGER);"""


async def test_an_old_accounts_db_opens_and_keeps_working(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "accounts.db"
    key_id, plain = new_key()
    with sqlite3.connect(path) as old:  # as written before expiry and allowlists existed
        old.executescript(OLD_SCHEMA)
        old.execute("INSERT INTO api_keys VALUES (?, ?, 'app', 'alice', 0, 1.0, NULL, 5, "
                    "NULL, 1)", (key_id, hash_key(plain)))
        old.execute("INSERT INTO usage_daily VALUES (?, 'm', '2026-01-01', 1, 2, 3)",
                    (key_id,))
    for _ in range(2):  # migrated once; opening again changes nothing
        store = await AccountStore.open(str(path), clock=FakeClock(wall_start=NOW),
                                        background=False)
        try:
            k = await store.authenticate(plain)
            assert k is not None and k.id == key_id and k.requests_per_min == 5
            assert k.expires_at is None and k.models is None  # old keys: no expiry, all
            rows = await store.usage(key_id=key_id)
            assert [(r.requests, r.estimated_requests) for r in rows] == [(1, 0)]
            await store.create_key("new", "bob", expires_at=NOW + 60, models=["m"])
        finally:
            await store.aclose()
    with sqlite3.connect(path) as db:
        cols = {r[1] for r in db.execute("PRAGMA table_info(api_keys)")}
        assert {"expires_at", "models"} <= cols
        assert db.execute("SELECT models FROM api_keys WHERE owner = 'bob'").fetchall() == [
            ('["m"]',), ('["m"]',)]
