"""`llmfabric start --public-addr` and `--public-http-addr` were not checked: the value was
published as given, and other nodes (or ingresses) failed to dial it later, far from the
typo. Both are checked up front, naming the flag (a config file's value, the setting);
what is accepted is what peers and ingresses dial: one host:port, IPv6 in brackets."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from llmfabric.cli import start as start_cli
from llmfabric.node.config import NodeConfig

from ._start_capture import capture_started

ENV_VARS = ("LLMFABRIC_PUBLIC_ADDR", "LLMFABRIC_PUBLIC_HTTP_ADDR", "LLMFABRIC_BOOTSTRAP",
            "LLMFABRIC_NETWORK_SECRET", "LLMFABRIC_HOME")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    return capture_started(monkeypatch, ENV_VARS)


def _start(home: pathlib.Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = CliRunner().invoke(start_cli.command,
                             ["--home", str(home), "--network-secret", "s" * 20, *args],
                             env=env)
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.parametrize("value", ["node1.example.org:7946", "10.0.0.5:17946",
                                   "[2001:db8::1]:7946", "gw_1.example:1"])
@pytest.mark.parametrize("flag", ["--public-addr", "--public-http-addr"])
def test_a_dialable_address_is_taken_as_given(
        tmp_path: pathlib.Path, started: list[NodeConfig], flag: str, value: str) -> None:
    code, out = _start(tmp_path, flag, value)
    assert code == 0, out
    assert getattr(started[-1], flag.removeprefix("--").replace("-", "_")) == value


@pytest.mark.parametrize(("value", "says"), [
    ("gateway", "'gateway' is not host:port (e.g. node1.example.org:7946)"),
    (":7946", "':7946' is not host:port"),
    ("node1:http", "'node1:http' is not host:port"),
    ("node1:70000", "out of range"),
    ("a:1,b:2", "give one host:port"),
    ("[fe80::x]:7946", "'fe80::x' is not an IPv6 address (e.g. [2001:db8::1]:7946)"),
    ("fe80::x:7946", "'fe80::x' is not an IPv6 address"),
    ("0.0.0.0:7946", "is a listen address, not one others can dial"),
    ("node1.example.org:0", "is a listen address, not one others can dial"),
    ("tls://node1:7946", "without a scheme"),
    ("bad/host:7946", "is not host:port"),
])
def test_a_bad_public_addr_is_refused_naming_the_flag(
        tmp_path: pathlib.Path, started: list[NodeConfig], value: str, says: str) -> None:
    code, out = _start(tmp_path, "--public-addr", value)
    assert code == 2, out
    assert "Invalid value for '--public-addr'" in out, out
    assert says in out, out
    assert not started


def test_a_bare_ipv6_peer_address_is_taken_as_peers_split_it(
        tmp_path: pathlib.Path, started: list[NodeConfig]) -> None:
    """Peers split a peer address at its last ':' (net/addressbook.py parse_addr), and
    Kubernetes renders `--public-addr $(POD_IP):7946` with a bare IPv6 pod address."""
    code, out = _start(tmp_path, "--public-addr", "fd00::5:7946")
    assert code == 0, out
    assert started[-1].public_addr == "fd00::5:7946"


@pytest.mark.parametrize(("value", "says"), [
    ("http://gw.example:8090", "give host:port without a scheme (e.g. node1.example.org:8090)"),
    # (ingresses dial http://ADDR: a bare IPv6 address is no URL host)
    ("fd00::5:8090", "put the IPv6 address in brackets, e.g. [fd00::5]:8090"),
])
def test_a_bad_public_http_addr_gets_an_http_example(
        tmp_path: pathlib.Path, started: list[NodeConfig], value: str, says: str) -> None:
    code, out = _start(tmp_path, "--public-http-addr", value)
    assert code == 2, out
    assert "Invalid value for '--public-http-addr'" in out, out
    assert says in out, out
    assert not started


def test_the_env_var_is_checked_too(tmp_path: pathlib.Path, started: list[NodeConfig]) -> None:
    code, out = _start(tmp_path, env={"LLMFABRIC_PUBLIC_ADDR": "gateway"})
    assert code == 2 and "'gateway' is not host:port" in out, out


def test_a_config_file_value_is_checked_naming_the_setting(
        tmp_path: pathlib.Path, started: list[NodeConfig]) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("public_addr: gateway\n")
    code, out = _start(tmp_path, "--config", str(cfg))
    assert code == 1, out
    assert "public_addr: 'gateway' is not host:port (e.g. node1.example.org:7946)" in out, out
    assert not started



@pytest.mark.parametrize("flag", ["--public-addr", "--public-http-addr"])
def test_spaces_around_an_address_are_not_published(
        tmp_path: pathlib.Path, started: list[NodeConfig], flag: str) -> None:
    # (' node1:7946 ' passed the check and went out with its spaces: no peer could dial it)
    code, out = _start(tmp_path, flag, " node1.example.org:7946 ")
    assert code == 0, out
    assert getattr(started[-1], flag.removeprefix("--").replace("-", "_")) == \
        "node1.example.org:7946"
