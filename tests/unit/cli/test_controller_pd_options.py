"""`llmfabric controller` without --pd-plan ignored --pd-cluster, --pd-links, --pd-topology
and --pd-model: a forgotten --pd-plan ran the assigning controller instead. They are refused
in the command's words, as --gpus-yaml was."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llmfabric.cli.controller import command
from llmfabric.cli.main import cli

DRY_RUN = ["controller", "--node", "http://127.0.0.1:1", "--once"]
# Every --pd-* option (one added later is checked too), and --gpus-yaml.
PD_INPUTS = sorted({opt for p in command.params for opt in p.opts
                    if opt.startswith("--pd-") and opt != "--pd-plan"} | {"--gpus-yaml"})


def test_the_pd_options_are_found() -> None:
    assert {"--pd-cluster", "--pd-links", "--pd-topology", "--pd-model"} <= set(PD_INPUTS)


@pytest.mark.parametrize("flag", PD_INPUTS)
def test_a_pd_option_without_pd_plan_is_refused(flag: str) -> None:
    res = CliRunner().invoke(cli, [*DRY_RUN, flag, __file__])  # (a file: the paths exist)
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert f"{flag} goes with --pd-plan (add --pd-plan PLAN.json, or drop it)" in out, out


def test_every_stray_option_is_named() -> None:
    res = CliRunner().invoke(cli, ["controller", "--launcher", "slurm", "--pd-cluster",
                                   __file__, "--pd-links", __file__])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "--pd-cluster, --pd-links go with --pd-plan" in out, out
    assert "or drop them" in out, out
