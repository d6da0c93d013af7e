"""Fixtures shared by integration tests: a throwaway PostgreSQL server (one per session, started
only when a test asks for it) and `accounts_db`, an accounts database URL parametrized over
SQLite and Postgres so the same checks run on both backends; for the API modules
(test_api_*), `fab`, one _api_fabric.ApiFabric per module, and `base`, its URL on each front
(the lean one and the aiohttp app) in turn; and closes, after each test, the SDK clients made
through _sdk_clients.tracked."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ._pg_cluster import PgServer, PostgresUnavailable, postgres_server
from ._sdk_clients import close_tracked

if TYPE_CHECKING:
    from ._api_fabric import ApiFabric


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    """Closes the SDK clients the test made through _sdk_clients.tracked."""
    yield
    close_tracked()


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


@pytest.fixture(scope="module")
def fab() -> Iterator[ApiFabric]:
    from ._api_fabric import api_fabric  # (only the API modules pay for its imports)

    yield from api_fabric()


@pytest.fixture(params=["fast", "aiohttp"])
def base(request: pytest.FixtureRequest, fab: ApiFabric) -> str:
    return fab.fast_url if request.param == "fast" else fab.aio_url
