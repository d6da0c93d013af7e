"""`llmfabric demo` on a port something already listens on (cli/demo.py)."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from llmfabric.cli import demo

pytestmark = pytest.mark.unit


def test_a_busy_port_is_refused_before_any_node_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second demo on 8080 took the first one's ingress for its own: it printed that
    address and an API key, then died on a missing admin.key with a traceback."""
    started: list[object] = []
    monkeypatch.setattr(demo, "LocalFabric", lambda *a, **k: started.append(a))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(demo.command, ["--port", str(port)])
    assert res.exit_code == 1 and not started
    assert f"port {port} is in use (another demo?)" in res.output and "--port N" in res.output


@pytest.mark.parametrize(("nodes", "expected"), [(2, "(ingress + 1 node)"),
                                                  (5, "(ingress + 4 nodes)")])
def test_the_banner_counts_nodes_in_good_english(nodes: int, expected: str) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    out = io.StringIO()
    fabric = SimpleNamespace(nodes=[None] * nodes, admin_key=lambda: "lf-admin")
    demo._print_howto(Console(file=out, width=200), "http://127.0.0.1:8080", "lf-k",
                      fabric, "m", no_auth=False)  # type: ignore[arg-type]
    assert expected in out.getvalue()
