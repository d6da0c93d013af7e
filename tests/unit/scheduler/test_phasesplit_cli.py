"""`llmfabric plan pd`: JSON plan from the shipped example inputs; bad inputs fail cleanly;
the placement command `llmfabric plan --cluster ...` is unchanged."""

from __future__ import annotations

import json
import re
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


def test_plan_pd_reschedule_after_losing_an_instance(tmp_path):
    base = ["plan", "pd", "--cluster", str(EX / "cloud32.yaml"), "--links",
            str(EX / "bw32.csv"), "--sim-duration", "20", "--json"]
    res = CliRunner().invoke(cli, [*base, "--model", "llama-30b", "--workload",
                                   str(EX / "conversation.yaml"), "--steps", "2",
                                   "--neighbors", "3"])
    assert res.exit_code == 0, res.output
    saved = tmp_path / "plan.json"
    saved.write_text(res.output)
    doc = json.loads(res.output)
    lost = doc["groups"][0]["gpus"]
    spec = f"{min(lost)}-{max(lost)}" if lost == list(range(min(lost), max(lost) + 1)) \
        else ",".join(map(str, lost))
    res = CliRunner().invoke(cli, [*base, "--reschedule", str(saved), "--lost-gpus", spec])
    assert res.exit_code == 0, res.output
    new = json.loads(res.output)
    assert not set(lost) & {i for g in new["groups"] for i in g["gpus"]}
    assert new["decisions"][-1]["type"] == "SetRouting"
    # surviving groups keep their TP/PP and stages exactly (no reload)
    old_layouts = {json.dumps(g["stages"]) for g in doc["groups"]}
    assert all(json.dumps(g["stages"]) in old_layouts for g in new["groups"])
    bad = CliRunner().invoke(cli, [*base, "--reschedule", str(saved), "--lost-gpus", "x-1"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output


def test_plan_pd_plans_on_gpus_of_a_gpus_yaml(tmp_path):
    """`--gpus-yaml` GPUs reach every lookup of the plan (cluster, configs, simulation)
    through the catalog the command passes on, and leave the built-in catalog untouched."""
    from llmfabric.sim import DEFAULT_CATALOG

    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  Big-A6000:\n    base: RTX-A6000\n    memory_gb: 96\n")
    cloud = (EX / "cloud32.yaml").read_text().replace("gpu: RTX-A6000", "gpu: big-a6000")
    cluster = tmp_path / "cloud.yaml"
    cluster.write_text(cloud)
    args = ["plan", "pd", "--cluster", str(cluster), "--links", str(EX / "bw32.csv"),
            "--model", "llama-30b", "--workload", str(EX / "conversation.yaml"), "--steps",
            "1", "--neighbors", "2", "--sim-duration", "10", "--json"]
    res = CliRunner().invoke(cli, [*args, "--gpus-yaml", str(gpus)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert sorted(i for g in doc["groups"] for i in g["gpus"]) == list(range(32))
    assert "Big-A6000" not in DEFAULT_CATALOG.names()
    res = CliRunner().invoke(cli, args)  # without the file the name is unknown, cleanly
    assert res.exit_code != 0 and "Big-A6000".lower() in res.output.lower()
    assert "Traceback" not in res.output


def test_plan_pd_help_shows_one_percent_sign():
    """click does not %-format help texts: '90 %%' was printed as written."""
    res = CliRunner().invoke(cli, ["plan", "pd", "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "90 % cap" in res.output and "%%" not in res.output


def test_plan_pd_compare_names_the_colocated_groups_in_words():
    """The colocated CP-SAT groups printed as a Python list ([['A40', 4, 2], ...])."""
    res = CliRunner().invoke(cli, [
        "plan", "pd", "--cluster", str(EX / "cloud32.yaml"), "--links", str(EX / "bw32.csv"),
        "--model", "llama-30b", "--workload", str(EX / "conversation.yaml"), "--steps", "2",
        "--neighbors", "3", "--sim-duration", "30", "--compare"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "colocated CP-SAT" in ln)
    assert "[[" not in line and re.search(r"colocated CP-SAT \((\S+ TP\d+ x\d+(, )?)+\)", line)


def test_plan_pd_reschedule_prints_decisions_in_words(tmp_path):
    """They printed as Python dicts with 17-digit floats."""
    base = ["plan", "pd", "--cluster", str(EX / "cloud32.yaml"), "--links",
            str(EX / "bw32.csv"), "--sim-duration", "20"]
    res = CliRunner().invoke(cli, [*base, "--model", "llama-30b", "--workload",
                                   str(EX / "conversation.yaml"), "--steps", "2",
                                   "--neighbors", "3", "--json"])
    assert res.exit_code == 0, res.output
    saved = tmp_path / "plan.json"
    saved.write_text(res.output)
    lost = json.loads(res.output)["groups"][0]["gpus"]
    res = CliRunner().invoke(cli, [*base, "--reschedule", str(saved), "--lost-gpus",
                                   ",".join(map(str, lost))])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("decision: SetRouting"))
    assert "{" not in line and "'" not in line and re.search(r"; x \[(\d\.\d\d ?)+\];", line)
