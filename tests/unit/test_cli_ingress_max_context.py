"""`llmfabric ingress --max-context MODEL=TOKENS` (repeatable): the context of a --backend
model stated by the operator, for engines that report none; refused with a clear message
when malformed, for a model no backend serves, twice for one model, or in fabric mode."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llmfabric.cli import ingress as ingress_cli
from llmfabric.cli.ingress import parse_max_contexts
from llmfabric.ingress.errors import ConfigError

pytestmark = pytest.mark.unit

MODELS = {"llama", "qwen"}


def test_max_contexts_parse() -> None:
    assert parse_max_contexts((), MODELS) == {}
    assert parse_max_contexts(("llama=32768", " qwen = 8192 "), MODELS) == {
        "llama": 32768, "qwen": 8192}


@pytest.mark.parametrize(("spec", "says"), [
    ("llama", "expected MODEL=TOKENS"),
    ("=4096", "expected MODEL=TOKENS"),
    ("llama=", "expected MODEL=TOKENS"),
    ("llama=0", "'0' is not a whole number of tokens above 0"),
    ("llama=-5", "'-5' is not a whole number"),
    ("llama=32k", "'32k' is not a whole number"),
    ("llama=1e5", "'1e5' is not a whole number"),
    ("llama=4096.0", "'4096.0' is not a whole number"),
    ("llama=²", "'²' is not a whole number"),
    ("mistral=4096", "no --backend serves 'mistral' (they serve llama, qwen)"),
])
def test_bad_max_contexts_are_refused(spec: str, says: str) -> None:
    with pytest.raises(ConfigError, match="--max-context") as err:
        parse_max_contexts((spec,), MODELS)
    assert says in str(err.value)


def test_a_model_stated_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="'llama' is given twice"):
        parse_max_contexts(("llama=4096", "llama=8192"), MODELS)


def _settings(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[
        list[ingress_cli.Settings], str, int]:
    seen: list[ingress_cli.Settings] = []
    monkeypatch.setattr(ingress_cli, "_run", lambda settings, reuse_port: seen.append(settings))
    for var in ("LLMFABRIC_NETWORK_SECRET", "LLMFABRIC_NETWORK_SECRET_FILE", "LLMFABRIC_DB"):
        monkeypatch.delenv(var, raising=False)
    out = CliRunner().invoke(ingress_cli.command, ["--no-auth", *args])
    return seen, out.output, out.exit_code


def test_the_cli_passes_stated_contexts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, output, code = _settings(
        monkeypatch, "--backend", "llama=127.0.0.1:9", "--backend", "qwen=127.0.0.1:10",
        "--max-context", "qwen=8192", "--max-context", "llama=131072")
    assert code == 0, output
    assert seen[0].max_contexts == (("llama", 131072), ("qwen", 8192))


def test_the_cli_refuses_a_bad_max_context(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, output, code = _settings(monkeypatch, "--backend", "llama=127.0.0.1:9",
                                   "--max-context", "lama=8192")
    assert code == 2 and not seen
    assert "Invalid value for --max-context" in output
    assert "no --backend serves 'lama' (they serve llama)" in output


def test_fabric_mode_refuses_max_context(monkeypatch: pytest.MonkeyPatch) -> None:
    _, output, code = _settings(monkeypatch, "--network-secret", "s" * 32,
                                "--max-context", "m=8192")
    assert code == 2 and "--max-context applies to --backend ingresses" in output


def test_help_names_the_option() -> None:
    out = CliRunner().invoke(ingress_cli.command, ["--help"])
    assert "--max-context MODEL=TOKENS" in out.output
