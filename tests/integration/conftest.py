"""Fixtures shared by integration tests: a throwaway PostgreSQL server (one per session, started
only when a test asks for it) and `accounts_db`, an accounts database URL parametrized over
SQLite and Postgres so the same checks run on both backends."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from ._pg_cluster import PgServer, PostgresUnavailable, postgres_server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A running PostgreSQL server; the tests that use it skip when none can be started."""
    cm = postgres_server()
    try:
        server = cm.__enter__()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """The URL of a fresh, empty Postgres database for this test."""
    return pg_server.new_database()


@pytest.fixture(params=["sqlite", "postgres"])
def accounts_db(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """An empty accounts database URL: a SQLite file, or a fresh Postgres database."""
    if request.param == "sqlite":
        return str(tmp_path / "accounts.db")
    url: str = request.getfixturevalue("pg_url")
    return url
