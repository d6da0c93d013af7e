"""`llmfabric engine torch` rejects bad layouts and schedules before starting anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llmfabric.cli.engine import command

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("args", "message"), [
    (["--dp", "2", "--widths", "1,4"], "width 4 must be a power of two dividing 2"),
    (["--dp", "1"], "width 2 must be a power of two dividing 1"),
    (["--dp", "4", "--widths", "1,3"], "width 3 must be a power of two"),
    (["--config", "no-such-model"], "unknown model config"),
    (["--switch-policy", "scheduled", "--schedule", "soon:2"], "T:WIDTH"),
])
def test_bad_engine_options_are_refused(args: list[str], message: str) -> None:
    pytest.importorskip("torch")
    result = CliRunner().invoke(command, ["torch", "--port", "1", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_help_names_the_switch_routes() -> None:
    result = CliRunner().invoke(command, ["torch", "--help"])
    assert result.exit_code == 0
    assert "/dtp_switch" in result.output and "--switch-policy" in result.output
