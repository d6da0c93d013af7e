"""`llmfabric controller --bootstrap ...` assigns SIMULATED engines by default (--template
sim): real GPU nodes then served made-up text with no word of it. It says so now."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest
from click.testing import CliRunner

import llmfabric.cli.controller as ctl_cli
from llmfabric.cli import controller_node


@contextlib.asynccontextmanager
async def bare_member(overrides: dict[str, Any], settle: float, clock: Any,
                      **_: Any) -> AsyncIterator[Any]:
    reader = types.SimpleNamespace(live_records=list, peer_of=lambda sid: None)
    node = types.SimpleNamespace(transport=None, providers=types.SimpleNamespace(identity=str))
    yield types.SimpleNamespace(node=node, stop=asyncio.Event(), reader=reader)


@pytest.mark.parametrize(("args", "warned"), [((), True), (("--template", "vllm"), False)])
def test_the_sim_template_is_named_when_executing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        args: tuple[str, ...], warned: bool) -> None:
    monkeypatch.setattr(controller_node, "controller_node", bare_member)
    with caplog.at_level(logging.WARNING):
        res = CliRunner().invoke(ctl_cli.command, [
            "--bootstrap", "127.0.0.1:1", "--network-secret", "s" * 32, "--once", *args])
    assert res.exit_code == 0, res.output
    sim = [r for r in caplog.records if "SIMULATED engines" in r.getMessage()]
    assert bool(sim) is warned
