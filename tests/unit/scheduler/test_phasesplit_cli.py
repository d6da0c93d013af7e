"""`llmfabric plan pd`: JSON plan from the shipped example inputs; bad inputs fail cleanly;
the placement command `llmfabric plan --cluster ...` is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli

pytestmark = pytest.mark.unit
EX = Path(__file__).resolve().parents[3] / "examples" / "thunderserve"


def test_plan_pd_json_on_the_paper_cloud():
    res = CliRunner().invoke(cli, [
        "plan", "pd", "--cluster", str(EX / "cloud32.yaml"), "--links", str(EX / "bw32.csv"),
        "--model", "llama-30b", "--workload", str(EX / "conversation.yaml"), "--steps", "2",
        "--neighbors", "3", "--sim-duration", "30", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    gpus = [i for g in doc["groups"] for i in g["gpus"]]
    assert sorted(gpus) == list(range(32))
    assert {g["phase"] for g in doc["groups"]} == {"prefill", "decode"}
    assert len(doc["routing"]["x"]) == doc["n_prefill"]
    assert all(len(row) == doc["n_decode"] for row in doc["routing"]["y"])
    assert sum(doc["routing"]["x"]) == pytest.approx(1.0)
    assert 0 <= doc["simulated"]["attainment"] <= 1


def test_plan_pd_rejects_mismatched_inputs(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("instances: [{gpu: A40, count: 2}]\n")
    res = CliRunner().invoke(cli, [
        "plan", "pd", "--cluster", str(bad), "--links", str(EX / "bw32.csv"),
        "--model", "llama-30b", "--workload", str(EX / "coding.yaml")])
    assert res.exit_code != 0 and "GPUs" in res.output
    bad.write_text("instances: [{gpu: NoSuchGPU, count: 2}]\n")
    res = CliRunner().invoke(cli, [
        "plan", "pd", "--cluster", str(bad), "--links", str(EX / "bw32.csv"),
        "--model", "llama-30b", "--workload", str(EX / "coding.yaml")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_plan_without_subcommand_is_still_the_placement():
    res = CliRunner().invoke(cli, ["plan", "--help"])
    assert res.exit_code == 0 and "--policy" in res.output and "plan pd" in res.output
