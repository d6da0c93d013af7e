"""`keys usage-export` and `keys budget set` refuse bad options in their own words (they gave
the API's: 'Invalid value: since must be a UTC day YYYY-MM-DD', 'a budget is in tokens or in
usd: give exactly one')."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.keys import keys_group


@pytest.mark.parametrize(("args", "said"), [
    (["usage-export", "--since", "yesterday"],
     "Invalid value for --since: 'yesterday' is not a UTC day: give YYYY-MM-DD, e.g. 2026-01-31"),
    (["usage-export", "--until", "2026-13-01"],
     "Invalid value for --until: '2026-13-01' is not a UTC day"),
    (["usage-export", "--since", "2026-02-01", "--until", "2026-01-01"],
     "Invalid value for --until: 2026-01-01 is before --since 2026-02-01"),
    (["budget", "set", "owner", "bob"],
     "give exactly one of --tokens N and --usd AMOUNT: a budget is in tokens or in USD"),
    (["budget", "set", "owner", "bob", "--tokens", "5", "--usd", "1"],
     "give exactly one of --tokens N and --usd AMOUNT"),
])
def test_bad_options_are_named(tmp_path: Path, args: list[str], said: str) -> None:
    res = CliRunner().invoke(keys_group, [*args, "--db", str(tmp_path / "accounts.db")])
    assert res.exit_code == 2 and said in " ".join(res.output.split()), res.output
