"""Shared test configuration: tests are marked by their directory (unit/integration/e2e)."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import settings

# No per-example deadline by default: a deadline is a timing assertion, and on a loaded 2-core
# machine (CI, or engines starting beside the suite) a slow example is not a wrong one. Tests
# that set their own settings(deadline=...) keep theirs.
settings.register_profile("llmfabric", deadline=None)
settings.load_profile("llmfabric")

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
