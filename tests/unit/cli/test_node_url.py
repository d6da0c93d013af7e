"""`--node` takes a node's HTTP URL: `host:port` alone is refused up front with the URL to
give (status said 'unknown url type' and asked whether a node was there; controller raised a
traceback), and a controller that cannot reach the node says so as status does."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli


@pytest.mark.parametrize("command", [["status"], ["slurm", "status", "1"],
                                     ["controller", "--once"]])
def test_a_node_without_a_scheme_is_refused_with_the_url_to_give(command: list[str]) -> None:
    res = CliRunner().invoke(cli, [*command, "--node", "127.0.0.1:8090"])
    assert res.exit_code == 2, res.output
    assert ("'127.0.0.1:8090' is no HTTP URL: give the node's HTTP address with http:// or "
            "https://, e.g. http://127.0.0.1:8090") in " ".join(res.output.split())


def test_an_unreachable_node_is_named_by_the_controller_as_by_status() -> None:
    with socket.socket() as sock:  # a port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for command in (["status"], ["controller", "--once"]):
        res = CliRunner().invoke(cli, [*command, "--node", url])
        assert res.exit_code == 1 and res.exception is not None, res.output
        assert res.output.startswith(f"Error: cannot reach {url}/v1/fabric/nodes: "), res.output
        assert "is a node's HTTP API there?" in res.output
        assert "registry" not in res.output


def test_status_refuses_a_timeout_that_is_not_positive() -> None:
    res = CliRunner().invoke(cli, ["status", "--timeout", "0"])
    assert res.exit_code == 2 and "'--timeout': 0.0 is not in the range x>0" in res.output
