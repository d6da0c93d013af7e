"""The commands that read or change what an accounts database holds (`keys list`, `revoke`,
`usage-export`, `budget list`, `budget rm`) refuse a database that is not there: a mistyped
--db or the wrong $LLMFABRIC_HOME made a new empty one (parent directories too), and `keys
list` then said 'no keys'. `keys create` still makes the database it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.keys import keys_group


@pytest.mark.parametrize("args", [["list"], ["revoke", "0" * 16], ["usage-export"],
                                  ["budget", "list"], ["budget", "rm", "owner", "bob"]])
def test_a_missing_database_is_named_and_not_created(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "typo" / "accounts.db"
    for where in (["--db", str(db)], ["--db", f"sqlite:///{db}"]):
        res = CliRunner().invoke(keys_group, [*args, *where])
        assert res.exit_code == 1, res.output
        assert f"no accounts database at {db}: give --db" in " ".join(res.output.split())
        assert not db.parent.exists()
    home = CliRunner().invoke(keys_group, args, env={"LLMFABRIC_HOME": str(tmp_path / "h"),
                                                     "LLMFABRIC_DB": None})
    assert f"no accounts database at {tmp_path / 'h' / 'accounts.db'}" in home.output


def test_create_makes_the_database_and_list_reads_it(tmp_path: Path) -> None:
    db = str(tmp_path / "new" / "accounts.db")
    made = CliRunner().invoke(keys_group, ["create", "--name", "a", "--owner", "o", "--json",
                                           "--db", db])
    assert made.exit_code == 0, made.output
    listed = CliRunner().invoke(keys_group, ["list", "--json", "--db", db])
    assert [k["id"] for k in json.loads(listed.output)] == [json.loads(made.output)["id"]]
