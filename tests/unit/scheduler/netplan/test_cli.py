"""`llmfabric plan net`, `simulate collective`, `simulate net` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmfabric.cli.main import cli

pytestmark = pytest.mark.unit

EX = Path(__file__).parents[4] / "examples" / "heroserve"


def test_simulate_collective_json() -> None:
    res = CliRunner().invoke(cli, ["simulate", "collective", "--topology",
                                   str(EX / "testbed-2tracks.yaml"), "--group",
                                   "gpu0,gpu1,gpu4,gpu5", "--bytes", "1MB", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["bytes"] == 1e6 and set(doc["ina"]) == {"access0", "access1", "core0"}
    assert doc["choice"]["scheme"] in {"ina", "ring"}
    bad = CliRunner().invoke(cli, ["simulate", "collective", "--topology",
                                   str(EX / "testbed-2tracks.yaml"), "--group", "gpu0,nope"])
    assert bad.exit_code != 0 and "nope" in bad.output


def test_plan_net_then_simulate_net(tmp_path: Path) -> None:
    out = tmp_path / "netplan.json"
    res = CliRunner().invoke(cli, [
        "plan", "net", "--topology", str(EX / "testbed-2tracks.yaml"), "--model", "opt-66b",
        "--prefill-gpus", "a100-*", "--decode-gpus", "v100-*", "--workload",
        str(EX / "sharegpt.yaml"), "--sla-ttft", "2.5", "--sla-tpot", "0.15", "--compare",
        "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["plan"]["system"] == "heroserve" and len(doc["compare"]) == 3
    assert json.loads(out.read_text()) == doc
    sim = CliRunner().invoke(cli, ["simulate", "net", "--plan", str(out), "--rate", "1",
                                   "--duration", "20", "--json"])
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.output)
    assert got["n_completed"] > 0 and got["p_all"] == doc["plan"]["p_all"]
    text = CliRunner().invoke(cli, ["simulate", "net", "--plan", str(out), "--rate", "1",
                                    "--duration", "20"])
    assert text.exit_code == 0, text.output
    # counts as integers, times to 6 significant digits (were 133.0 and 16 digits)
    assert f"n_completed: {got['n_completed']:g}\n" in text.output
    assert f"mean_ttft_s: {got['mean_ttft_s']:.6g}\n" in text.output


def test_base_commands_still_run_without_subcommand() -> None:
    res = CliRunner().invoke(cli, ["plan", "--help"])
    assert res.exit_code == 0 and "--cluster" in res.output and "plan net" in res.output
    res2 = CliRunner().invoke(cli, ["simulate", "net", "--help"])
    assert res2.exit_code == 0 and "--plan" in res2.output


@pytest.mark.parametrize("text,value", [("1MB", 1e6), ("512KiB", 524288.0), ("4e6", 4e6),
                                        ("0", 0.0), ("2 GB", 2e9)])
def test_parse_bytes(text: str, value: float) -> None:
    from llmfabric.cli.netplan import parse_bytes

    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "1PB", "1e999", "nan", "1..2MB"])
def test_parse_bytes_rejects(text: str) -> None:
    import click

    from llmfabric.cli.netplan import parse_bytes

    with pytest.raises(click.BadParameter):
        parse_bytes(text)


def test_hostile_plan_file_is_a_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    for content in ("[]", "{}", '{"inputs": {"topology": "/nonexistent"}}', "not json"):
        bad.write_text(content)
        res = CliRunner().invoke(cli, ["simulate", "net", "--plan", str(bad), "--rate", "1"])
        assert res.exit_code != 0
        assert "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)


def test_simulate_collective_net_latency() -> None:
    """The NIC cost joins a cross-server group's ring and INA once; 0 removes it."""
    from llmfabric.scheduler.netplan.commcost import NET_COLLECTIVE_S

    def run(*extra: str) -> dict:  # type: ignore[type-arg]
        res = CliRunner().invoke(cli, ["simulate", "collective", "--topology",
                                       str(EX / "testbed-2tracks.yaml"), "--group",
                                       "gpu0,gpu1,gpu4,gpu5", "--bytes", "1MB", "--json",
                                       *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)  # type: ignore[no-any-return]

    default, off, more = run(), run("--net-latency", "0"), run("--net-latency", "1e-4")
    assert default["ring_s"] - off["ring_s"] == pytest.approx(NET_COLLECTIVE_S, rel=1e-9)
    assert more["ring_s"] - off["ring_s"] == pytest.approx(1e-4, rel=1e-9)
    for s, row in default["ina"].items():
        assert row["net_s"] == NET_COLLECTIVE_S and off["ina"][s]["net_s"] == 0
        assert row["total_s"] - off["ina"][s]["total_s"] == pytest.approx(NET_COLLECTIVE_S)
    bad = CliRunner().invoke(cli, ["simulate", "collective", "--topology",
                                   str(EX / "testbed-2tracks.yaml"), "--group", "gpu0,gpu4",
                                   "--net-latency", "-1"])
    assert bad.exit_code != 0


def test_out_with_from_fabric_needs_save_topology(tmp_path: Path) -> None:
    """The plan file names its topology for `simulate net`: a fabric's URL is none it can read
    (it failed there with "cannot read topology http://...")."""
    res = CliRunner().invoke(cli, [
        "plan", "net", "--from-fabric", "http://127.0.0.1:9", "--model", "opt-66b",
        "--prefill-gpus", "a*", "--decode-gpus", "b*", "--workload",
        str(EX / "sharegpt.yaml"), "--sla-ttft", "2.5", "--sla-tpot", "0.15",
        "--out", str(tmp_path / "plan.json")])
    assert res.exit_code == 2 and "--save-topology" in res.output
    assert not (tmp_path / "plan.json").exists()


def test_simulate_net_names_the_plan_files_it_takes(tmp_path: Path) -> None:
    pd_plan = tmp_path / "pd.json"  # (a `plan pd --json` plan: no inputs)
    pd_plan.write_text('{"plan_id": "x", "model": "llama-30b", "groups": []}')
    res = CliRunner().invoke(cli, ["simulate", "net", "--plan", str(pd_plan), "--rate", "1"])
    assert res.exit_code == 1
    assert "no `llmfabric plan net --out` file" in res.output and "KeyError" not in res.output


def test_a_workload_of_another_planner_names_the_missing_key() -> None:
    """`plan net --workload` given `plan`'s models: list said "KeyError('mean_in')"."""
    res = CliRunner().invoke(cli, [
        "plan", "net", "--topology", str(EX / "testbed-2tracks.yaml"), "--model", "opt-66b",
        "--prefill-gpus", "a100-*", "--decode-gpus", "v100-*", "--workload",
        str(EX.parent / "workload-table1.yaml"), "--sla-ttft", "2.5", "--sla-tpot", "0.15"])
    assert res.exit_code == 1
    assert "no mean_in (a plan net workload is {rate, mean_in, mean_out})" in res.output
    assert "KeyError" not in res.output
