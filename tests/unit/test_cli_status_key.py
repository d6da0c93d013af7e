"""`llmfabric status` against an ingress whose fleet views need an API key (cli/status.py):
the key comes from --api-key or $LLMFABRIC_API_KEY, and a 401 says what to do."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli.status import command

pytestmark = pytest.mark.unit

KEY = "lf-0123456789abcdef-secret"


def _ingress(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """A fake ingress that answers only requests bearing KEY; returns the keys it saw."""
    seen: list[str | None] = []

    def urlopen(req: urllib.request.Request, timeout: float = 0) -> Any:
        auth = req.get_header("Authorization")
        seen.append(auth)
        if auth != f"Bearer {KEY}":
            raise urllib.error.HTTPError(req.full_url, 401, "Unauthorized", {}, None)  # type: ignore[arg-type]
        body = {"nodes": []} if req.full_url.endswith("/nodes") else {"models": []}
        return io.BytesIO(json.dumps(body).encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.delenv("LLMFABRIC_API_KEY", raising=False)
    return seen


def test_without_a_key_the_error_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _ingress(monkeypatch)
    result = CliRunner().invoke(command, ["--node", "http://127.0.0.1:8080"])
    assert result.exit_code == 1
    assert "needs an API key (HTTP 401)" in result.output
    assert "--api-key" in result.output and "LLMFABRIC_API_KEY" in result.output
    assert "--public-fleet-info" in result.output


def test_a_wrong_key_is_named_as_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _ingress(monkeypatch)
    result = CliRunner().invoke(command, ["--node", "http://x:8080", "--api-key", "lf-bad"])
    assert result.exit_code == 1 and "refused the API key (HTTP 401)" in result.output


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_key_is_sent_from_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    seen = _ingress(monkeypatch)
    args = ["--node", "http://x:8080", "--json"]
    env = {}
    if how == "flag":
        args += ["--api-key", KEY]
    else:
        env["LLMFABRIC_API_KEY"] = KEY
    result = CliRunner().invoke(command, args, env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"nodes": [], "models": []}
    assert seen == [f"Bearer {KEY}"] * 2


def test_no_node_at_the_default_address_says_to_give_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmfabric status` right after `./scripts/demo` asks 127.0.0.1:8090 (a node's default
    HTTP port), where nothing listens: the demo's ingress is on 8080."""
    def refused(req: urllib.request.Request, timeout: float = 0) -> Any:
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(urllib.request, "urlopen", refused)
    monkeypatch.delenv("LLMFABRIC_NODE", raising=False)
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:8090/v1/fabric/nodes" in result.output
    assert "--node URL" in result.output and "8080 for the demo" in result.output
