"""`llmfabric controller --pd-plan` loads a plan made with `plan pd --gpus-yaml` (custom
GPUs) when given the same `--gpus-yaml`; it had no such option, so such a plan could not
be loaded, and its unknown-GPU error named no way out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "thunderserve"
LINKS = str(EXAMPLES / "bw32.csv")


@pytest.fixture
def custom(tmp_path: Path) -> dict[str, str]:
    """A cluster with a GPU only a GPUs YAML adds, that file, and a plan made with both."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text((EXAMPLES / "cloud32.yaml").read_text()
                       .replace("gpu: RTX-A6000", "gpu: Z900"))
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  Z900:\n    base: RTX-A6000\n")
    res = CliRunner().invoke(cli, [
        "plan", "pd", "--cluster", str(cluster), "--links", LINKS, "--model", "llama-30b",
        "--workload", str(EXAMPLES / "coding.yaml"), "--gpus-yaml", str(gpus),
        "--steps", "0", "--sim-duration", "1", "--json"])
    assert res.exit_code == 0, res.output
    plan = tmp_path / "plan.json"
    plan.write_text(res.stdout)
    return {"cluster": str(cluster), "gpus": str(gpus), "plan": str(plan),
            "home": str(tmp_path / "home")}


def _controller(custom: dict[str, str], *extra: str) -> Any:
    return CliRunner().invoke(cli, [
        "controller", "--bootstrap", "127.0.0.1:1", "--network-secret", "s" * 32,
        "--home", custom["home"], "--listen", "127.0.0.1:0", "--settle", "0", "--once",
        "--pd-plan", custom["plan"], "--pd-cluster", custom["cluster"], "--pd-links", LINKS,
        *extra])


def test_the_plan_loads_with_the_gpus_it_was_made_with(
        custom: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfabric.node import daemon

    class Joined(Exception):
        """The plan loaded and the controller went on to join the fabric."""

    def start(self: Any) -> None:
        raise Joined

    monkeypatch.setattr(daemon.Node, "start", start)
    res = _controller(custom, "--gpus-yaml", custom["gpus"])
    assert isinstance(res.exception, Joined), res.output


def test_without_them_the_error_names_the_option(custom: dict[str, str]) -> None:
    res = _controller(custom)
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "unknown GPU 'Z900'" in out, out
    assert "Add your own with --gpus-yaml FILE" in out, out
    assert "load_gpus_yaml" not in out


def test_gpus_yaml_goes_with_pd_plan() -> None:
    res = CliRunner().invoke(cli, ["controller", "--node", "http://127.0.0.1:1", "--once",
                                   "--gpus-yaml", __file__])
    assert res.exit_code == 2
    assert "--gpus-yaml goes with --pd-plan" in res.output
