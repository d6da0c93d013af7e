"""`llmfabric controller --once` that decides nothing says why on stderr (it printed `[]`
alone: no bare node accepts assignments, or no demand was observed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import llmfabric.cli.controller as ctl_cli


def view(sid: str, *, roles: list[str], models: list[str]) -> dict[str, Any]:
    return {"session_id": sid, "peer_id": f"p-{sid}", "state": "SERVING" if models else "JOIN",
            "suspected": False, "engine": "sim" if models else "", "roles": roles,
            "hardware": {"gpu_model": "A100-80GB", "gpu_count": 1, "gpu_memory_gb": 80.0,
                         "interconnect": "none"}, "models": [{"id": m} for m in models]}


def run_once(monkeypatch: pytest.MonkeyPatch, views: list[dict[str, Any]],
             *args: str) -> Any:
    async def fake_fetch(url: str) -> list[Any]:
        return [(ctl_cli.record_from_view(v), "") for v in views]

    monkeypatch.setattr(ctl_cli, "_fetch", fake_fetch)
    res = CliRunner().invoke(ctl_cli.command, ["--node", "http://n:8080", "--once", *args])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == []
    return res


def test_no_bare_assignable_node(monkeypatch: pytest.MonkeyPatch) -> None:
    serving = [view("a", roles=[], models=["llama-3.1-8b"])]
    res = run_once(monkeypatch, serving)
    assert "nothing to do: no node to fill" in res.stderr and "--accept-assignments" in res.stderr
    assert "--reclaim" in res.stderr
    res = run_once(monkeypatch, serving, "--reclaim")  # (not assignable: never reclaimed)
    assert "no node to fill" in res.stderr and "--reclaim" not in res.stderr


def test_no_observed_demand(monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_once(monkeypatch, [view("idle", roles=["assignable"], models=[])])
    assert "nothing to do: no demand to plan for" in res.stderr and "--workload" in res.stderr
