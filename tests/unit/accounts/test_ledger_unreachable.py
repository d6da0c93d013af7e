"""A usage flush against a database that stopped answering keeps its rows for the next flush,
says why in the log (the driver's error, not a bare "failed"), and succeeds once it answers."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from llmfabric.accounts.db import SQLiteBackend
from llmfabric.accounts.ledger import UsageLedger


class Flaky:
    """A real SQLite backend that can be told to stop answering, like a database gone away."""

    def __init__(self, inner: SQLiteBackend) -> None:
        self.inner = inner
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionRefusedError("database host refused the connection")

    async def execute(self, sql: str, params: Any = ()) -> None:
        self._check()
        await self.inner.execute(sql, params)

    async def executemany(self, sql: str, rows: Any) -> None:
        self._check()
        await self.inner.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        self._check()
        return await self.inner.fetchall(sql, params)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_flush_to_a_silent_database_keeps_its_rows_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    db = Flaky(await SQLiteBackend.open(":memory:"))
    ledger = UsageLedger(db, lambda: 1_700_000_000.0)
    ledger.record("key-1", "m", 10, 5)
    db.down = True
    with caplog.at_level(logging.WARNING, logger="llmfabric.accounts.ledger"), \
            pytest.raises(ConnectionRefusedError):
        await ledger.flush()
    assert ledger.pending_rows == 1 and not ledger.quarantined
    [rec] = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert "refused the connection" in rec.getMessage()
    db.down = False
    assert await ledger.flush() == 1 and ledger.pending_rows == 0
    rows = await db.fetchall("SELECT key_id, requests, prompt_tokens FROM usage_daily")
    assert rows == [("key-1", 1, 10)]
    await db.aclose()
