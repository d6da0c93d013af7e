"""An unknown GPU's error names only options the command has: `--gpus-yaml FILE` where the
command takes it (`simulate`, `plan pd`), no such hint where it does not (`plan`, `plan net`,
`simulate flying`: each told users to pass --gpus-yaml, which they reject)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def _with_gpu(tmp_path: Path, example: str, field: str) -> str:
    path = tmp_path / Path(example).name
    text = (EXAMPLES / example).read_text()
    assert field in text
    path.write_text(text.replace(field, field.split()[0] + " Z900", 1))
    return str(path)


def _error(args: list[str]) -> str:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    assert "unknown GPU 'Z900'" in res.output, res.output
    assert "load_gpus_yaml" not in res.output  # (a Python call: no use on a command line)
    return " ".join(res.output.split())


def _options(args: list[str]) -> set[str]:
    help_text = CliRunner().invoke(cli, [*args, "--help"]).output
    return {w.rstrip(",") for w in help_text.split() if w.startswith("--")}


@pytest.mark.parametrize("command", ["simulate", "simulate flying"])
def test_simulate_hints_only_where_the_option_exists(command: str) -> None:
    args = [*command.split(), "--model", "llama-3.1-8b", "--gpu", "Z900"]
    out = _error(args)
    has_option = "--gpus-yaml" in _options(command.split())
    assert has_option == (command == "simulate")
    assert ("--gpus-yaml FILE" in out) == has_option, out


def test_plan_and_plan_net_name_no_option_they_lack(tmp_path: Path) -> None:
    cluster = _with_gpu(tmp_path, "cluster-table1.yaml", "gpu: GH200")
    out = _error(["plan", "--cluster", cluster, "--workload",
                  str(EXAMPLES / "workload-table1.yaml")])
    assert out.count("Z900") == 1, out  # (was "does not know GPU 'Z900': unknown GPU 'Z900'")
    assert "--gpus-yaml" not in _options(["plan"]) and "--gpus-yaml" not in out, out
    topology = _with_gpu(tmp_path, "heroserve/unit-2tracks.yaml", "type: A100-80GB")
    out = _error(["plan", "net", "--topology", topology, "--model", "opt-175b",
                  "--prefill-gpus", "gpu0", "--decode-gpus", "gpu1", "--workload",
                  str(EXAMPLES / "heroserve" / "sharegpt.yaml"), "--sla-ttft", "4",
                  "--sla-tpot", "0.2"])
    assert "--gpus-yaml" not in _options(["plan", "net"]) and "--gpus-yaml" not in out, out


def test_plan_pd_hints_at_its_gpus_yaml(tmp_path: Path) -> None:
    cluster = _with_gpu(tmp_path, "thunderserve/cloud32.yaml", "gpu: RTX-A6000")
    out = _error(["plan", "pd", "--cluster", cluster, "--links",
                  str(EXAMPLES / "thunderserve" / "bw32.csv"), "--model", "llama-30b",
                  "--workload", str(EXAMPLES / "thunderserve" / "coding.yaml")])
    assert "--gpus-yaml" in _options(["plan", "pd"])
    assert "Add your own with --gpus-yaml FILE" in out, out
