"""The `slurm_cluster` fixture: one real Slurm (slurmctld + slurmd + munged) per session.

It skips with the reason when Slurm cannot run here (not root, no apt), except in CI
(env CI=true), where that is a failure: the `slurm` tests must run there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ._slurm_cluster import SlurmCluster, SlurmUnavailable, slurm_cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    cm = slurm_cluster()
    try:
        cluster = cm.__enter__()
    except SlurmUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the slurm tests, but: {exc}")
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cm.__exit__(None, None, None)
