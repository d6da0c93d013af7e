"""`llmfabric controller --launcher slurm --once` where Slurm does not answer: one error line
(it was a traceback), as `llmfabric slurm status` gives."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import types
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli import controller as ctl_cli
from llmfabric.cli import controller_node, controller_slurm
from llmfabric.launch.slurm import Slurm

PROFILE = """name: sim
engine: llmfabric engine sim --model llama-3.1-8b --port {port}
fabric: {bootstrap: ["127.0.0.1:7946"], secret_file: ~/secret}
controller: {model: llama-3.1-8b, capacity_rps: 4}
"""


def no_slurm_here(argv: Sequence[str], stdin: str | None) -> tuple[int, str, str]:
    return 1, "", f"{argv[0]}: fatal: Could not establish a configuration source\n"


@contextlib.asynccontextmanager
async def bare_member(overrides: dict[str, Any], settle: float, clock: Any,
                      **_: Any) -> AsyncIterator[Any]:
    node = types.SimpleNamespace(config=types.SimpleNamespace(operator_key=None))
    yield types.SimpleNamespace(node=node, stop=asyncio.Event(),
                                reader=types.SimpleNamespace(live_records=list))


def test_once_without_a_reachable_slurm_is_one_error_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    profile = tmp_path / "sim.yaml"
    profile.write_text(PROFILE)
    monkeypatch.setattr(controller_node, "controller_node", bare_member)
    monkeypatch.setattr(controller_slurm, "Slurm", lambda: Slurm(no_slurm_here))
    res = CliRunner().invoke(ctl_cli.command, [
        "--launcher", "slurm", "--profile", str(profile), "--bootstrap", "127.0.0.1:1",
        "--network-secret", "s" * 32, "--once"])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "Error: squeue: fatal: Could not establish a configuration source" in res.output
    assert "Traceback" not in res.output
