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


LONG_PROVIDER = "swiss-national-supercomputing-centre"
LONG_MODEL = "meta-llama/Llama-3.1-70B-Instruct-FP8-dynamic"


def _cell(table: Any, index: int, width: int) -> list[str]:
    """The lines of column `index` of a one-row table printed `width` columns wide."""
    out = io.StringIO()
    table_console(file=out).print(table, width=width)
    body = out.getvalue().split("┡", 1)[1]
    parts = [line.split("│")[index + 1].strip() for line in body.splitlines() if "│" in line]
    return [p for p in parts if p]


@pytest.mark.parametrize("width", [200, 80])
def test_long_provider_and_model_names_are_shown_whole(
        monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    """Names are never cut (to 14 characters, or to "meta-llama/…" by a narrow terminal):
    a long one folds onto the next lines of its cell."""
    monkeypatch.delenv("COLUMNS", raising=False)
    node = {**_node("SERVING", [], "vllm", (LONG_MODEL,)), "provider_id": LONG_PROVIDER,
            "verified_provider": LONG_PROVIDER}
    provider = "".join(_cell(nodes_table([node]), 3, width)).replace(" ", "")
    assert provider == LONG_PROVIDER + "(verified)"
    assert "".join(_cell(nodes_table([node]), 6, width)) == LONG_MODEL
    model = {"id": LONG_MODEL, "serving": 1, "nodes": ["a"], "providers": [LONG_PROVIDER],
             "gpus": ["H100"], "quantizations": ["fp8"], "max_context": 131072}
    assert "".join(_cell(models_table([model]), 0, width)) == LONG_MODEL
    assert "".join(_cell(models_table([model]), 3, width)) == LONG_PROVIDER
    assert _cell(models_table([model]), 6, width) == ["131072"]  # (kept on one line)


@pytest.mark.hostile
def test_a_long_name_is_shown_whole_with_its_controls_escaped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    node = {**_node("SERVING", []), "provider_id": "lab-" + "x" * 30 + "\x1b]52;c;AAAA\x07"}
    _, text = _rows(nodes_table([node]))
    assert "\x1b" not in text and "\x07" not in text
    assert "lab-" + "x" * 30 + "\\x1b]52;c;AAAA\\x07" in text
