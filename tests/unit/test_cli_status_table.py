"""`llmfabric status` tables (cli/status.py), rendered as a piped console would print them."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest

from llmfabric.cli.console import table_console
from llmfabric.cli.status import models_table, nodes_table

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


def _rows(table: Any) -> tuple[list[str], str]:
    out = io.StringIO()
    table_console(file=out).print(table)
    text = out.getvalue()
    return text.splitlines(), text


def test_a_provider_name_is_marked_verified_or_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the dashboard's badges: X-Fabric-Providers matches a node's verified identity, so
    only a name equal to it is marked verified; a PSK node's name (its identity is its peer
    id) and an impostor's are claimed; a view without `verified_provider` gets no mark."""
    monkeypatch.delenv("COLUMNS", raising=False)
    lab = {**_node("SERVING", [], "vllm", ("a",)), "session_id": "lab00000",
           "provider_id": "my-lab", "verified_provider": "my-lab"}
    fake = {**_node("SERVING", [], "vllm", ("b",)), "session_id": "fake0000",
            "provider_id": "my-lab", "verified_provider": "zQmImpostor"}
    old = {**_node("SERVING", [], "vllm", ("c",)), "session_id": "old00000",
           "provider_id": "old-lab"}
    lines, text = _rows(nodes_table([lab, fake, old]))
    assert "my-lab (verified)" in next(ln for ln in lines if "lab00000" in ln)
    assert "my-lab (claimed)" in next(ln for ln in lines if "fake0000" in ln)
    old_row = next(ln for ln in lines if "old00000" in ln)
    assert "old-lab" in old_row and "(verified)" not in old_row and "(claimed)" not in old_row
    assert "X-Fabric-Providers matches the name" in text  # the caption says what they mean


def test_the_models_table_marks_claimed_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    model = {"id": "llama", "serving": 2, "nodes": ["a", "b"], "providers": ["my-lab", "uni"],
             "unverified_providers": ["uni"], "gpus": ["H100"], "quantizations": ["bf16"],
             "max_context": 8192}
    lines, text = _rows(models_table([model]))
    row = next(ln for ln in lines if "llama" in ln)
    assert "my-lab (verified), uni (claimed)" in row
    assert "X-Fabric-Providers matches the name" in text
