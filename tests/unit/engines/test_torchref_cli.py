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


@pytest.mark.hostile
@pytest.mark.parametrize(("args", "waiting", "priority"), [
    ([], 1024, 0),
    (["--switch-policy", "priority"], 1024, 1),
    (["--switch-policy", "priority", "--max-priority", "0"], 1024, 0),
    (["--max-waiting", "8", "--max-priority", "3"], 8, 3),
])
def test_waiting_and_priority_limits_reach_the_engine(
        monkeypatch: pytest.MonkeyPatch, args: list[str], waiting: int, priority: int) -> None:
    """Clients' priority is clamped to --max-priority (0 unless the operator runs the
    priority policy or grants more); --max-waiting bounds the waiting queues."""
    pytest.importorskip("torch")
    from llmfabric.engines.torchref import server
    from llmfabric.engines.torchref.engine import EngineOptions

    seen: list[EngineOptions] = []

    async def serve(options: EngineOptions, config: object) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(server, "serve", serve)
    result = CliRunner().invoke(command, ["torch", "--port", "1", *args])
    assert result.exit_code == 0, result.output
    opts = seen[0]
    assert (opts.max_waiting, opts.max_priority) == (waiting, priority)
    assert CliRunner().invoke(command, ["torch", "--port", "1", "--max-waiting", "0"]
                              ).exit_code == 2
