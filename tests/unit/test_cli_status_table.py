"""`llmfabric status` tables (cli/status.py), rendered as a piped console would print them."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from llmfabric.cli.console import table_console
from llmfabric.cli.status import nodes_table

pytestmark = pytest.mark.unit


def _node(state: str, roles: list[str], engine: str = "", models: tuple[str, ...] = ()
          ) -> dict[str, Any]:
    return {"session_id": "af13b843aaaa", "state": state, "suspected": False,
            "roles": roles, "provider_id": "fabric", "engine": engine,
            "hardware": {"gpu_count": 0, "gpu_model": "cpu"},
            "models": [{"id": m} for m in models], "load": {"inflight": 0}, "labels": {},
            "relays": [], "peer_addrs": ["127.0.0.1:14729"], "last_seen": time.time()}


def test_a_bare_ingress_shows_its_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    table_console(file=out).print(nodes_table([
        _node("JOIN", ["ingress", "relay", "bootstrap"]),
        _node("SERVING", [], "vllm", ("llama-3.1-8b",)),
    ]))
    lines = out.getvalue().splitlines()
    ingress = next(ln for ln in lines if "JOIN" in ln)
    assert "ingress,relay,bootstrap" in ingress
    serving = next(ln for ln in lines if "SERVING" in ln)
    assert "vllm" in serving and "llama-3.1-8b" in serving


@pytest.mark.hostile
def test_markup_in_a_nodes_record_is_printed_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Roles, labels, engine and model names come from other nodes' records: "[/]" or
    "[bold red]" there is text, not rich markup (which would raise or restyle the table)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    hostile = _node("SERVING", ["[/]"], "[bold red]vllm", ("[/]m",))
    hostile["labels"] = {"site": "[link=http://x]y"}
    out = io.StringIO()
    table_console(file=out).print(nodes_table([hostile]))
    row = next(ln for ln in out.getvalue().splitlines() if "SERVING" in ln)
    assert "[/]" in row and "[bold red]vllm" in row and "[/]m" in row
    assert "site=[link=http://x]y" in row
