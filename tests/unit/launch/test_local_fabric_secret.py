"""The local fabric (`llmfabric demo`, multi-process tests) gives its nodes the network
secret without putting it on their command lines."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest

from llmfabric.launch.local import LocalFabric


class _Spawned:
    def __init__(self, cmd: list[str], **kw: Any) -> None:
        self.cmd, self.env = cmd, kw["env"]


@pytest.mark.hostile
def test_the_network_secret_is_not_on_any_node_s_command_line(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any user of a shared login node reads argv (ps, /proc/PID/cmdline); with the demo's
    secret they could join its fabric on loopback."""
    monkeypatch.setattr(subprocess, "Popen", _Spawned)  # (launch/local.py calls it so)
    fabric = LocalFabric(tmp_path, secret="s3cret-network-secret-0123")
    node = fabric._spawn("ingress", ["--ingress"])
    spawned: Any = node.proc
    assert isinstance(spawned, _Spawned)
    assert not any("s3cret" in arg for arg in spawned.cmd), spawned.cmd
    assert spawned.env["LLMFABRIC_NETWORK_SECRET"] == "s3cret-network-secret-0123"
