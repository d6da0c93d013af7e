"""Shared test configuration: tests are marked by their directory (unit/integration/e2e); with
LLMFABRIC_LEAKCHECK=1, a test that leaves an unclosed socket, transport or file behind fails
(see _leaked)."""

from __future__ import annotations

import gc
import os
import pathlib
import tracemalloc
import warnings
from collections.abc import Generator

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


# Off by default (a full collection after every test costs time). An object leaked by one
# test is otherwise only noticed when the collector happens to run inside a later test that
# makes ResourceWarning an error (test_net_*, test_link_service), far from its cause.
_LEAKCHECK = os.environ.get("LLMFABRIC_LEAKCHECK", "") not in ("", "0")
_TRACE = int(os.environ.get("LLMFABRIC_LEAKCHECK_TRACE", "0") or 0)  # frames per allocation


def _leaked() -> list[str]:
    """What the garbage collector finds unclosed now, with where it was made when traced."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    out = []
    for w in seen:
        if not issubclass(w.category, ResourceWarning):
            continue
        tb = tracemalloc.get_object_traceback(w.source) if w.source is not None else None
        out.append(str(w.message) + ("\n" + "\n".join(tb.format()) if tb else ""))
    return out


if _LEAKCHECK:

    def pytest_configure(config: pytest.Config) -> None:
        if _TRACE and not tracemalloc.is_tracing():
            tracemalloc.start(_TRACE)  # (this process only: not PYTHONTRACEMALLOC's children)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
        yield
        leaks = _leaked()
        if leaks:
            raise AssertionError(
                f"{item.nodeid} left {len(leaks)} unclosed resource(s) behind:\n" + "\n".join(leaks)
            )
