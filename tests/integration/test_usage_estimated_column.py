"""Estimated usage rows on a real SQLite database, including one created before the
`estimated_requests` column existed (migrated in place on open)."""

from __future__ import annotations

import pathlib
import sqlite3

import pytest

from llmfabric.accounts import AccountStore

pytestmark = pytest.mark.integration

OLD_SCHEMA = """CREATE TABLE usage_daily (
    key_id TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (key_id, model, day))"""


async def test_estimated_requests_counted_and_old_databases_migrated(
        tmp_path: pathlib.Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute(OLD_SCHEMA)
        conn.execute("INSERT INTO usage_daily VALUES ('k_old', 'm', '2026-01-01', 3, 30, 9)")
    async with await AccountStore.open(str(db)) as store:
        key, _ = await store.create_key("k", "alice")
        store.record_usage(key.id, "tiny", 10, 4)
        store.record_usage(key.id, "tiny", 7, 3, estimated=True)
        store.record_usage(key.id, "tiny", 5, 2, estimated=True)
        await store.flush()
        rows = {r.key_id: r for r in await store.usage()}
    assert rows["k_old"].requests == 3 and rows["k_old"].estimated_requests == 0
    new = rows[key.id]
    assert (new.requests, new.prompt_tokens, new.completion_tokens) == (3, 22, 9)
    assert new.estimated_requests == 2
    assert new.to_json()["estimated_requests"] == 2
    # Reopening an already migrated database is a no-op.
    async with await AccountStore.open(str(db)) as store:
        assert {r.key_id for r in await store.usage()} == {"k_old", key.id}
