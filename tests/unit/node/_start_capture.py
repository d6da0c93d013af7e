"""What the `llmfabric start` tests share: `run_node` replaced by a capture of the config it
would run, so a test reads what the command line made of its flags, env and files."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from llmfabric.cli import start as start_cli
from llmfabric.node.config import NodeConfig


def capture_started(monkeypatch: pytest.MonkeyPatch, clear_env: Iterable[str] = (), *,
                    warn: bool = False) -> list[NodeConfig]:
    """The configs `start` hands to `run_node`, in order (no node starts). `clear_env`: env
    vars removed first (the test's own environment must not leak in); `warn`: the config's
    warnings are printed as `run_node` would."""
    seen: list[NodeConfig] = []

    def fake_run_node(config: NodeConfig, *, banner: bool = True) -> int:
        if warn:
            start_cli.warn_config(config)
        seen.append(config)
        return 0

    monkeypatch.setattr(start_cli, "run_node", fake_run_node)
    for name in clear_env:
        monkeypatch.delenv(name, raising=False)
    return seen
