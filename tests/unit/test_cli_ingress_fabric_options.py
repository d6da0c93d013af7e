"""`llmfabric ingress` in fabric mode takes the network secret from a 0600 file
(`--network-secret-file`, as `llmfabric start`: a secret on the command line shows in `ps`)
and a state directory (`--home`); a standalone ingress keeps its accounts under --home."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli import ingress as ingress_cli
from llmfabric.cli import start
from llmfabric.node.admission import admission_from_config
from llmfabric.node.config import NodeConfig

pytestmark = pytest.mark.unit

SECRET = "0123456789abcdef0123456789abcdef"


def _capture_node(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    """Instead of running the node: its config, after the node's own admission check."""
    seen: list[NodeConfig] = []

    def run_node(config: NodeConfig, **_: Any) -> int:
        admission_from_config(config)  # (Node() reads the secret file so, and refuses so)
        seen.append(config)
        return 0

    monkeypatch.setattr(start, "run_node", run_node)
    monkeypatch.setattr(start, "setup_logging", lambda verbose: None)
    for var in ("LLMFABRIC_NETWORK_SECRET", "LLMFABRIC_NETWORK_SECRET_FILE", "LLMFABRIC_HOME",
                "LLMFABRIC_BOOTSTRAP", "LLMFABRIC_DB"):
        monkeypatch.delenv(var, raising=False)
    return seen


def _secret_file(tmp_path: pathlib.Path, mode: int = 0o600) -> pathlib.Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(mode)
    return path


def test_a_secret_file_starts_a_fabric_ingress_with_its_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    seen = _capture_node(monkeypatch)
    secret, home = _secret_file(tmp_path), tmp_path / "state"
    out = CliRunner().invoke(ingress_cli.command, [
        "--network-secret-file", str(secret), "--home", str(home), "--no-auth"])
    assert out.exit_code == 0, out.output
    [config] = seen
    assert config.ingress and config.network_secret is None
    assert config.network_secret_file == secret and config.home == home


def test_the_secret_file_comes_from_the_environment_too(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    seen = _capture_node(monkeypatch)
    monkeypatch.setenv("LLMFABRIC_NETWORK_SECRET_FILE", str(_secret_file(tmp_path)))
    out = CliRunner().invoke(ingress_cli.command, ["--no-auth"])
    assert out.exit_code == 0, out.output
    assert seen[0].network_secret_file == tmp_path / "secret"


def test_a_secret_file_others_can_read_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _capture_node(monkeypatch)
    out = CliRunner().invoke(ingress_cli.command, [
        "--network-secret-file", str(_secret_file(tmp_path, 0o644)), "--no-auth"])
    assert out.exit_code != 0
    assert "readable by others: chmod 600 it" in str(out.exception), out.output


def test_without_backends_or_a_secret_the_error_names_both_ways(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _capture_node(monkeypatch)
    out = CliRunner().invoke(ingress_cli.command, [])
    assert out.exit_code == 2
    assert "--backend" in out.output and "--network-secret[-file]" in out.output


def test_a_standalone_ingress_keeps_its_accounts_under_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    _capture_node(monkeypatch)
    seen: list[ingress_cli.Settings] = []
    monkeypatch.setattr(ingress_cli, "_run", lambda settings, reuse_port: seen.append(settings))
    out = CliRunner().invoke(ingress_cli.command, [
        "--backend", "m=127.0.0.1:9", "--home", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert seen[0].db_url == str(tmp_path / "accounts.db")
