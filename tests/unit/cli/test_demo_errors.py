"""`llmfabric demo`'s first error paths: options out of range are refused up front
(`--speed 0` waited 120 s for engines that never served, then raised a traceback), a fabric
that does not come up is one error line whose logs are kept, and the hint for a `llmfabric`
not on PATH names where it is (it said .venv/bin, wherever that was)."""

from __future__ import annotations

import pathlib
import socket
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli import demo


@pytest.mark.parametrize("args", [["--speed", "0"], ["--speed", "-2"], ["--duration", "-1"],
                                  ["--port", "0"], ["--port", "70000"]])
def test_options_out_of_range_are_refused(args: list[str]) -> None:
    res = CliRunner().invoke(demo.command, args)
    assert res.exit_code == 2 and "is not in the range" in res.output, res.output


class _Fabric:
    """LocalFabric's surface the demo uses, with engines that never serve."""

    def __init__(self, root: pathlib.Path, **_: Any) -> None:
        self.root, self.closed = root, False
        (root / "node-1.log").write_text("why it failed\n")

    def start_ingress(self, *_: str) -> object:
        return object()

    def add_node(self, _: object) -> None:
        pass

    def wait_serving(self, want: dict[str, int], timeout: float) -> None:
        raise TimeoutError(f"models not serving within {timeout}s: want {want}, saw {{}}")

    def close(self) -> None:
        self.closed = True


def test_a_fabric_that_does_not_come_up_is_one_line_and_keeps_its_logs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(demo, "LocalFabric", _Fabric)
    monkeypatch.setattr(demo.signal, "signal", lambda *_: None)  # (pytest's own handlers stay)
    root = tmp_path / "state"
    monkeypatch.setattr(demo.tempfile, "mkdtemp", lambda prefix: str(root.mkdir() or root))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = CliRunner().invoke(demo.command, ["--port", str(port), "--node", "m@H100"])
    assert res.exit_code == 1 and res.exception is not None
    assert "Traceback" not in res.output
    assert ("Error: the demo fabric did not come up: models not serving within 120s: want "
            f"{{'m': 1}}, saw {{}}\nthe nodes' logs are kept under {root}") in res.output
    assert (root / "node-1.log").exists()


def test_the_hint_for_a_command_not_on_path_names_where_it_is(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    monkeypatch.setattr(sys, "executable", str(python))
    assert demo._cli_hint() == f"{python} -m llmfabric"
    (python.parent / "llmfabric").write_text("")
    assert demo._cli_hint() == str(python.parent / "llmfabric")
