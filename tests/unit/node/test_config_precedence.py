"""Configuration precedence through the real `llmfabric start` command line:
defaults < config file < environment variables < flags; and the bootstrap list may be one
comma-separated string (config file or env var)."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from llmfabric.cli import start as start_cli
from llmfabric.node.config import NodeConfig

from ._start_capture import capture_started

ENV_VARS = ("LLMFABRIC_PROVIDER", "LLMFABRIC_PRESET", "LLMFABRIC_BOOTSTRAP",
            "LLMFABRIC_PUBLIC_ADDR", "LLMFABRIC_NETWORK_SECRET", "LLMFABRIC_HOME",
            "LLMFABRIC_PUBLIC_HTTP_ADDR")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    return capture_started(monkeypatch, ENV_VARS)


def _start(tmp_path: pathlib.Path, args: list[str], env: dict[str, str]) -> None:
    res = CliRunner().invoke(start_cli.command,
                             ["--home", str(tmp_path), "--network-secret", "s" * 20, *args],
                             env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output


def test_defaults_file_env_flags_in_that_order(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("provider: from-file\npreset: wan\npublic_addr: file.example:1\n"
                   "bootstrap: [file.example:7946]\n")
    env = {"LLMFABRIC_PROVIDER": "from-env", "LLMFABRIC_PRESET": "local",
           "LLMFABRIC_BOOTSTRAP": "env-a:1,env-b:2"}
    _start(tmp_path, [], {})
    assert started[-1].provider == "" and started[-1].preset == "lan"  # defaults
    _start(tmp_path, ["--config", str(cfg)], {})
    c = started[-1]  # the file over the defaults
    assert (c.provider, c.preset, c.public_addr) == ("from-file", "wan", "file.example:1")
    assert c.bootstrap == ("file.example:7946",)
    _start(tmp_path, ["--config", str(cfg)], env)
    c = started[-1]  # env vars over the file; what env does not set still comes from the file
    assert (c.provider, c.preset, c.public_addr) == ("from-env", "local", "file.example:1")
    assert c.bootstrap == ("env-a:1", "env-b:2")
    _start(tmp_path, ["--config", str(cfg), "--provider", "from-flag", "--bootstrap", "f:3"],
           env)
    c = started[-1]  # flags over everything
    assert (c.provider, c.preset) == ("from-flag", "local") and c.bootstrap == ("f:3",)


def test_bootstrap_as_one_comma_separated_string_in_a_config_file(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text('bootstrap: "a:1,b:2"\n')
    _start(tmp_path, ["--config", str(cfg)], {})
    assert started[-1].bootstrap == ("a:1", "b:2")
    cfg.write_text('bootstrap: "a:1,not-an-address"\n')
    res = CliRunner().invoke(start_cli.command, ["--home", str(tmp_path), "--network-secret",
                                                 "s" * 20, "--config", str(cfg)])
    assert res.exit_code != 0 and "bootstrap" in res.output


def test_public_http_addr_and_min_relays_from_flags_and_env(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    _start(tmp_path, [], {})
    assert started[-1].public_http_addr is None and started[-1].min_relays == 1
    _start(tmp_path, ["--min-relays", "2"], {"LLMFABRIC_PUBLIC_HTTP_ADDR": "gw.example:18090"})
    c = started[-1]
    assert (c.public_http_addr, c.min_relays) == ("gw.example:18090", 2)
    res = CliRunner().invoke(start_cli.command, ["--home", str(tmp_path), "--network-secret",
                                                 "s" * 20, "--min-relays", "0"])
    assert res.exit_code != 0 and "min-relays" in res.output


def test_an_unknown_config_file_key_is_named_as_such(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    """A typo in the config file said pydantic's 'Extra inputs are not permitted'."""
    cfg = tmp_path / "node.yaml"
    cfg.write_text("http_lsten: 127.0.0.1:8090\n")
    res = CliRunner().invoke(start_cli.command, ["--home", str(tmp_path), "--network-secret",
                                                 "s" * 20, "--config", str(cfg)])
    assert res.exit_code == 1 and not started
    assert "http_lsten: unknown setting" in res.output and "docs/node.md" in res.output
    assert "Extra inputs" not in res.output
