"""Rate limits past the database columns' range are refused at the edge (HTTP body model and
CLI option), never sent to the driver (2**63 used to be a 500)."""

from __future__ import annotations

import pathlib

import pydantic
import pytest
from click.testing import CliRunner

from llmfabric.accounts.http import CreateKeyBody, OwnerLimitsBody
from llmfabric.accounts.policy import MAX_RATE_LIMIT
from llmfabric.cli.apikeys import create

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [MAX_RATE_LIMIT + 1, 2**63, 2**64, 0, -1])
def test_out_of_range_limits_are_invalid(value: int) -> None:
    with pytest.raises(pydantic.ValidationError):
        OwnerLimitsBody(requests_per_min=value)
    with pytest.raises(pydantic.ValidationError):
        CreateKeyBody(name="k", tokens_per_min=value)


def test_the_largest_limit_is_accepted() -> None:
    assert OwnerLimitsBody(tokens_per_min=MAX_RATE_LIMIT).tokens_per_min == MAX_RATE_LIMIT


def test_cli_refuses_a_limit_past_the_range(tmp_path: pathlib.Path) -> None:
    out = CliRunner().invoke(create, ["--name", "k", "--owner", "o", "--rpm", str(2**63),
                                      "--db", f"sqlite:///{tmp_path}/a.db"])
    assert out.exit_code == 2, out.output
    assert "--rpm" in out.output
