"""`llmfabric controller --network-secret-file FILE`: the controller's secret can come from a
file, as `start`'s and `ingress`'s can (it could only come from the command line or the
environment), with the same checks of the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli

SECRET = "0123456789abcdef0123456789abcdef"


def _secret_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


def _controller(tmp_path: Path, secret_file: Path) -> Any:
    return CliRunner().invoke(cli, [
        "controller", "--bootstrap", "127.0.0.1:1", "--network-secret-file", str(secret_file),
        "--home", str(tmp_path / "home"), "--listen", "127.0.0.1:0", "--once",
        "--settle", "0"], env={"LLMFABRIC_NETWORK_SECRET": None})


def test_a_file_others_can_read_is_refused_as_start_refuses_it(tmp_path: Path) -> None:
    res = _controller(tmp_path, _secret_file(tmp_path, 0o644))
    assert res.exit_code == 1, res.output
    assert "is readable by others: chmod 600 it" in res.output


def test_the_secret_of_the_file_admits_the_controller_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfabric.identity import PskAdmission
    from llmfabric.node import daemon

    admitted: list[Any] = []

    class Stop(Exception):
        pass

    def start(self: Any) -> None:
        admitted.append(self.admission)
        raise Stop

    monkeypatch.setattr(daemon.Node, "start", start)
    res = _controller(tmp_path, _secret_file(tmp_path, 0o600))
    assert isinstance(res.exception, Stop), res.output
    [admission] = admitted
    assert isinstance(admission, PskAdmission)
    assert admission._secrets == (SECRET.encode(),)  # (line 1 of the file)
