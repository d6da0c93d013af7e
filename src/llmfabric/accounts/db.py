"""Database backends behind one tiny async interface: SQLite (WAL, default) and Postgres.

SQL is written once with `?` placeholders and portable syntax (INSERT ... ON CONFLICT DO
UPDATE works on SQLite >= 3.24 and Postgres); the Postgres backend rewrites placeholders
(`?` -> `%s`, a literal `%` -> `%%`).
SQLite calls run in a worker thread (asyncio.to_thread), one at a time, so the event loop
never blocks on disk I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pathlib
import sqlite3
import urllib.parse
from collections.abc import Sequence
from typing import Any, Protocol

from llmfabric.accounts.errors import BackendUnavailable, InvalidRequest
from llmfabric.untrusted import get_logger

Params = Sequence[Any]
log = get_logger(__name__)

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
        record_trace INTEGER NOT NULL DEFAULT 1,
        expires_at DOUBLE PRECISION,
        models TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS api_keys_owner ON api_keys (owner)",
    """CREATE TABLE IF NOT EXISTS usage_daily (
        key_id TEXT NOT NULL,
        model TEXT NOT NULL,
        day TEXT NOT NULL,
        requests BIGINT NOT NULL DEFAULT 0,
        prompt_tokens BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        estimated_requests BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, model, day)
    )""",
    # Usage read in batches (ledger.pages), the whole ledger or one key's rows, walks these
    # in export order (by day) instead of sorting every matching row once per batch.
    # (Ledger flushes only add to counters: the indexed columns of a row never change.)
    "CREATE INDEX IF NOT EXISTS usage_daily_day ON usage_daily (day, key_id, model)",
    "CREATE INDEX IF NOT EXISTS usage_daily_key ON usage_daily (key_id, day, model)",
    """CREATE TABLE IF NOT EXISTS owner_limits (
        owner TEXT PRIMARY KEY,
        requests_per_min INTEGER,
        tokens_per_min INTEGER
    )""",
)
# Columns added after their table was first released, (table, column, declaration): a
# database created before gets them when it is opened (its rows read as the default: no
# expiry, every model), so an old accounts.db keeps working. Append only.
ADDED_COLUMNS = (
    # Requests whose tokens the ingress counted itself (the engine reported none).
    ("usage_daily", "estimated_requests", "BIGINT NOT NULL DEFAULT 0"),
    # Key expiry (Unix seconds, NULL: never) and model allowlist (a JSON list, NULL: all).
    ("api_keys", "expires_at", "DOUBLE PRECISION"),
    ("api_keys", "models", "TEXT"),
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
            for table, column, decl in ADDED_COLUMNS:
                cols = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                if column not in cols:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
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
    """Postgres through psycopg 3 (optional extra `llmfabric[postgres]`).

    One autocommit connection shared by every task of the process, used one call at a time
    (an asyncio.Lock; the store's hot path never waits on it: keys are cached and usage is
    flushed in batches). A connection the server dropped (restart, idle kill) is replaced on
    the next call; reads and the store's idempotent key writes are retried once on the new
    connection, a failed batch is not (the ledger puts its rows back for the next flush).
    """

    _SCHEMA_LOCK = 0x6C66_6163  # advisory lock id: concurrent openers create tables in turn

    def __init__(self, url: str, conn: Any) -> None:
        self._url = url
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str) -> PostgresBackend:
        backend = cls(url, await _pg_connect(url))
        async with backend._lock, backend._conn.transaction():
            await backend._conn.execute("SELECT pg_advisory_xact_lock(%s)", (cls._SCHEMA_LOCK,))
            for stmt in SCHEMA:
                await backend._conn.execute(stmt)
            for table, column, decl in ADDED_COLUMNS:
                await backend._conn.execute(
                    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {decl}")
        return backend

    async def _ready(self) -> Any:
        if self._conn.closed or self._conn.broken:
            with contextlib.suppress(Exception):  # (a dead connection: replaced below)
                await self._conn.close()
            self._conn = await _pg_connect(self._url)
        return self._conn

    async def _retrying(self, call: Any) -> Any:
        """Run `call(conn)`; if the connection turns out dead, once more on a fresh one."""
        import psycopg

        async with self._lock:
            conn = await self._ready()
            try:
                return await call(conn)
            except psycopg.OperationalError:
                if not (conn.closed or conn.broken):
                    raise
                log.warning("accounts: lost the Postgres connection; reconnecting")
            return await call(await self._ready())

    async def execute(self, sql: str, params: Params = ()) -> None:
        async def run(conn: Any) -> None:
            await conn.execute(_pg_sql(sql), tuple(params))

        await self._retrying(run)

    async def executemany(self, sql: str, rows: Sequence[Params]) -> None:
        async with self._lock:
            conn = await self._ready()
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(_pg_sql(sql), [tuple(r) for r in rows])

    async def fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        async def run(conn: Any) -> list[tuple[Any, ...]]:
            cur = await conn.execute(_pg_sql(sql), tuple(params))
            return list(await cur.fetchall())

        result: list[tuple[Any, ...]] = await self._retrying(run)
        return result

    async def aclose(self) -> None:
        async with self._lock:
            await self._conn.close()


@functools.lru_cache(maxsize=256)
def _pg_sql(sql: str) -> str:
    """`?` placeholders to psycopg's `%s` (a literal `%` becomes `%%`)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _redact(url: str) -> str:
    """The URL without its password, for error messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


async def _pg_connect(url: str) -> Any:
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:
        raise BackendUnavailable(
            "a postgresql:// URL needs psycopg: pip install 'llmfabric[postgres]'"
        ) from exc
    try:
        extra: dict[str, Any] = (
            {} if "connect_timeout" in conninfo_to_dict(url) else {"connect_timeout": 10}
        )
    except psycopg.ProgrammingError as exc:
        raise InvalidRequest(f"bad Postgres URL {_redact(url)!r}: {exc}") from exc
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        raise BackendUnavailable(
            f"cannot connect to Postgres at {_redact(url)}: {str(exc).strip()}; check that the "
            "server is running and that the URL's host, port, user, password and database "
            "are right (the database must exist: createdb NAME)"
        ) from exc


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
