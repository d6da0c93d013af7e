"""`llmfabric keys create --expires/--models` and what `keys list` shows of them."""

from __future__ import annotations

import json
import pathlib
import time

from click.testing import CliRunner

from llmfabric.cli.apikeys import create, list_


def test_create_with_expiry_and_models_then_list(tmp_path: pathlib.Path) -> None:
    db = str(tmp_path / "accounts.db")
    out = CliRunner().invoke(create, ["--name", "course", "--owner", "cs101", "--expires",
                                      "30d", "--models", "llama-8b, qwen-7b", "--json",
                                      "--db", db])
    assert out.exit_code == 0, out.output
    made = json.loads(out.output)
    assert made["models"] == ["llama-8b", "qwen-7b"]
    assert abs(made["expires_at"] - (time.time() + 30 * 86_400)) < 60
    out = CliRunner().invoke(create, ["--name", "a", "--owner", "o", "--expires",
                                      "2027-01-31", "--db", db])
    assert out.exit_code == 0 and "expires 2027-01-31T00:00:00Z" in out.output
    out = CliRunner().invoke(list_, ["--db", db])
    assert "EXPIRES" in out.output and "llama-8b,qwen-7b" in out.output
    assert "all" in out.output.splitlines()[-1]  # the second key: every model
    listed = json.loads(CliRunner().invoke(list_, ["--json", "--db", db]).output)
    assert [k["models"] for k in listed] == [["llama-8b", "qwen-7b"], None]
    for bad in (["--expires", "soon"], ["--expires", "2020-01-01"], ["--models", ","]):
        out = CliRunner().invoke(create, ["--name", "x", "--owner", "o", *bad, "--db", db])
        assert out.exit_code != 0 and "Error" in out.output, bad


def test_create_refusals_name_its_own_options(tmp_path: pathlib.Path) -> None:
    """They gave the admin API's words: 'expires_at is in the past' and 'models must name at
    least one model id (leave it unset for all models)'."""
    db = str(tmp_path / "accounts.db")
    for bad, said in (
        (["--expires", "2020-01-01"], "Invalid value for --expires: '2020-01-01' is in the past "
         "(2020-01-01T00:00:00Z): give a later date, or a duration from now such as 30d"),
        (["--models", " , "], "Invalid value for --models: ' , ' names no model id: leave "
         "--models out for a key that reaches every model"),
    ):
        out = CliRunner().invoke(create, ["--name", "x", "--owner", "o", *bad, "--db", db])
        assert out.exit_code == 2 and said in " ".join(out.output.split()), out.output
        assert "expires_at" not in out.output and "unset" not in out.output
