"""The measured data that data-dependent tests read, and the one rule for when it is absent.

The directory is $LLMFABRIC_SHARED_DATA, default ../shared/data next to the repository. A test
that needs a file there calls `require_data(path)`: outside CI a missing file skips the test
(a checkout without the data); in CI (CI=1/true/yes) it FAILS, naming the path, because a
skipped accuracy test would pass having checked nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def shared_data(*parts: str) -> Path:
    """A path under the shared data directory (it may not exist)."""
    root = os.environ.get("LLMFABRIC_SHARED_DATA")
    return (Path(root) if root else _REPO.parent / "shared" / "data").joinpath(*parts)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_data(*paths: Path) -> None:
    """Skip the calling test (fail it in CI) unless every path exists."""
    missing = [p for p in paths if not p.exists()]
    if not missing:
        return
    import pytest  # a test-time dependency only

    what = ", ".join(str(p) for p in missing)
    if in_ci():
        pytest.fail(f"shared data missing in CI: {what} (set LLMFABRIC_SHARED_DATA)")
    pytest.skip(f"shared data not present: {what} (this fails in CI)")
