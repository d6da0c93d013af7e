"""`llmfabric bench` options (cli/bench.py)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli import bench as bench_cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://127.0.0.1:8080/",
                                 "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1/"])
def test_base_url_is_the_server_root_with_or_without_v1(
        monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The demo prints the OpenAI base URL (.../v1); given to --base-url it made every
    request go to /v1/v1/completions and fail with 404."""
    seen: list[str] = []

    def fake_run(opts: dict[str, Any]) -> dict[str, Any]:
        seen.append(opts["base_url"])
        raise bench_cli.click.ClickException("stop")

    monkeypatch.setattr(bench_cli, "_run", fake_run)
    res = CliRunner().invoke(bench_cli.command, ["--base-url", url, "--model", "m"])
    assert res.exit_code == 1 and seen == ["http://127.0.0.1:8080"]


def test_a_run_where_every_request_failed_exits_with_status_1(tmp_path: Any) -> None:
    """It exited 0 with all-zero latency tables (a wrong URL, key or model looked like a run
    to scripts); the report and the JSON are still written, then one error line."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(bench_cli.command, [
        "--base-url", f"http://127.0.0.1:{port}", "--model", "m", "--num-prompts", "2",
        "--request-rate", "100", "--duration", "5", "--quiet", "--json", str(out)])
    assert res.exit_code == 1, res.output
    assert "| Failed requests | 2 |" in res.output
    # no server there: nothing to read under Errors but the connection failures
    assert (f"Error: no request succeeded (connection: 2); nothing answered at "
            f"http://127.0.0.1:{port}: is the server running there? (--base-url)") in res.output
    assert out.exists()


def test_a_base_url_without_a_scheme_is_refused_up_front() -> None:
    """`--base-url 127.0.0.1:8080` ran the whole load and reported every request as
    'connection x1: 127.0.0.1:8080/v1/completions'."""
    res = CliRunner().invoke(bench_cli.command, ["--base-url", "127.0.0.1:8080", "--model", "m"])
    assert res.exit_code == 2
    assert "'127.0.0.1:8080' is no URL: give it with http:// or https://" in res.output


@pytest.mark.parametrize("text", ["2,5", "2-5"])
def test_rate_ranges_take_a_comma_or_a_dash(text: str) -> None:
    """bench wrote LOW,HIGH and `simulate flying` LOW-HIGH; each refused the other's."""
    from llmfabric.cli.simulate_flying import rate_range

    assert rate_range(text) == (2.0, 5.0)
    assert rate_range("4") == (4.0, 4.0)
    for bad in ("5,2", "0-1", "x", "2,inf"):
        with pytest.raises(bench_cli.click.BadParameter):
            rate_range(bad)
