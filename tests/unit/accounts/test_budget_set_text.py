"""`llmfabric keys budget set` says plainly what it set: for whom (and whose keys that
covers), the amount and its unit, and the period with when it renews."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.accounts.budgets import validate_budget
from llmfabric.cli.budgets import budget_set_text

pytestmark = pytest.mark.unit


def test_a_token_budget_of_an_owner() -> None:
    assert budget_set_text(validate_budget("owner", "alice", 2_000_000, "month")) == (
        "budget set for owner 'alice' (all their API keys together): at most 2,000,000 "
        "tokens (prompt + completion) per UTC month, renewed on the 1st at 00:00 UTC "
        "(replaces any earlier budget)")


def test_a_spend_budget_of_a_team() -> None:
    assert budget_set_text(validate_budget("team", "nlp", None, "day", usd=2.5)) == (
        "budget set for team 'nlp' (the API keys of all its members together): at most $2.5 "
        "of spend (at the prices `keys budget price` sets) per UTC day, renewed at 00:00 UTC "
        "(replaces any earlier budget)")


def test_a_token_budget_of_a_key() -> None:
    text = budget_set_text(validate_budget("key", "k3f9a0c1d2e4b5a6", 500, "day"))
    assert text.startswith("budget set for API key 'k3f9a0c1d2e4b5a6': at most 500 tokens ")


def test_the_cli_prints_it(tmp_path: Path) -> None:
    from llmfabric.cli.keys import keys_group

    out = CliRunner().invoke(keys_group, ["budget", "set", "owner", "alice", "--tokens",
                                          "1500", "--period", "month", "--db",
                                          str(tmp_path / "acc.db")])
    assert out.exit_code == 0, out.output
    assert out.output == budget_set_text(validate_budget("owner", "alice", 1500, "month")) + "\n"
