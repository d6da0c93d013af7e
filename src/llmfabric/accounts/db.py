"""Database backends behind one tiny async interface: SQLite (WAL, default) and Postgres.

SQL is written once with `?` placeholders and portable syntax (INSERT ... ON CONFLICT DO
UPDATE works on SQLite >= 3.24 and Postgres); the Postgres backend rewrites placeholders.
SQLite calls run in a worker thread (asyncio.to_thread), one at a time, so the event loop
never blocks on disk I/O.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol

from llmfabric.accounts.errors import BackendUnavailable, InvalidRequest

Params = Sequence[Any]

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS api_keys (
        id TEXT PRIMARY KEY,
        key_hash TEXT NOT NULL,
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        admin INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        requests_per_min INTEGER,
        tokens_per_min INTEGER,
        record_trace INTEGER NOT NULL DEFAULT 1
    )""",
    "CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner)",
    """CREATE TABLE IF NOT EXISTS usage_daily (
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,
        day TEXT NOT NULL,
        requests BIGINT NOT NULL DEFAULT 0,
        prompt_tokens BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, model, day)
    )""",
)


class Backend(Protocol):
    async def execute(self, sql: str, params: Params = ()) -> None: ...

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None: ...

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]: ...

    async def aclose(self) -> None: ...


class SQLiteBackend:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str) -> SQLiteBackend:
        def connect() -> sqlite3.Connection:
            if path != ":memory:":
                pathlib.Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                os.path.expanduser(path), check_same_thread=False, isolation_level=None,
                timeout=30.0,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            for stmt in SCHEMA:
                conn.execute(stmt)
            return conn

        return cls(await asyncio.to_thread(connect))

    async def _run(self, fn: Any, *args: Any) -> Any:
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    async def execute(self, sql: str, params: Params = ()) -> None:
        await self._run(self._conn.execute, sql, tuple(params))

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        def run() -> None:
            with self._conn:  # one transaction for the batch
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany(sql, [tuple(r) for r in rows])

        await self._run(run)

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            return list(self._conn.execute(sql, tuple(params)).fetchall())

        result: list[tuple[Any, ...]] = await self._run(run)
        return result

    async def aclose(self) -> None:
        await self._run(self._conn.close)


class PostgresBackend:
    """Postgres through psycopg 3 (optional extra `llmfabric[postgres]`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str) -> PostgresBackend:
        try:
            import psycopg
        except ImportError as exc:
            raise BackendUnavailable(
                "a postgresql:// URL needs psycopg: pip install 'llmfabric[postgres]'"
            ) from exc
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        backend = cls(conn)
        for stmt in SCHEMA:
            await backend.execute(stmt)
        return backend

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")

    async def execute(self, sql: str, params: Params = ()) -> None:
        async with self._lock:
            await self._conn.execute(self._sql(sql), tuple(params))

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
            await cur.executemany(self._sql(sql), [tuple(r) for r in rows])

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        async with self._lock:
            cur = await self._conn.execute(self._sql(sql), tuple(params))
            return list(await cur.fetchall())

    async def aclose(self) -> None:
        await self._conn.close()


async def open_backend(url: str) -> Backend:
    """"sqlite:///path", "sqlite://:memory:", a plain path, or "postgresql://..."."""
    if url.startswith(("postgresql://", "postgres://")):
        return await PostgresBackend.open(url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        # sqlite:////abs/path and sqlite:///rel/path, as SQLAlchemy spells them.
        return await SQLiteBackend.open(path if path.startswith("/") else path or ":memory:")
    if url in ("sqlite://", "sqlite://:memory:", ":memory:"):
        return await SQLiteBackend.open(":memory:")
    if "://" in url:
        raise InvalidRequest(f"unknown database URL scheme in {url!r}; use sqlite:/// or postgresql://")
    return await SQLiteBackend.open(url)
