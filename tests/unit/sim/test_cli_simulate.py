"""`llmfabric simulate` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmfabric.cli.main import cli


def test_simulate_json() -> None:
    res = CliRunner().invoke(cli, ["simulate", "--model", "llama-3.1-8b", "--gpu", "H100",
                                   "--tp", "2", "--rate", "4", "--duration", "30", "--input",
                                   "512", "--output", "64", "--slo-ttft", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["gpu"] == "H100-SXM" and data["tp"] == 2
    assert data["n_completed"] == data["requests"] > 0
    assert 0 < data["mean_ttft_s"] < data["mean_e2e_s"]
    assert data["slo_attainment"] == 1.0


def test_simulate_table_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,input_tokens,output_tokens\n0,100,10\n0.5,200,20\n1.0,300,30\n")
    res = CliRunner().invoke(cli, ["simulate", "--model", "qwen3-1.7b", "--gpu", "rtx 4090",
                                   "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "3 / 0" in res.output


def test_simulate_infeasible_is_a_clear_error() -> None:
    res = CliRunner().invoke(cli, ["simulate", "--model", "llama-3.1-70b", "--gpu", "A100",
                                   "--duration", "5"])
    assert res.exit_code != 0
    assert "does not fit" in res.output


def test_simulate_on_off_bursts_keep_the_mean_rate() -> None:
    """--arrival on_off: bursts of --on-s seconds at rate x (on + off) / on, silences of
    --off-s seconds; the same arrivals as sim.on_off."""
    from llmfabric import sim

    args = ["simulate", "--model", "qwen3-1.7b", "--gpu", "H100", "--rate", "4", "--duration",
            "60", "--input", "128", "--output", "16", "--arrival", "on_off", "--on-s", "5",
            "--off-s", "15", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    expected = sim.on_off(16.0, 5.0, 15.0, 60.0, 128, 16, 0)
    assert data["requests"] == len(expected) > 0
    assert 0.5 * 4 * 60 < data["requests"] < 1.5 * 4 * 60
    assert all(t % 20.0 < 5.0 for t in expected.arrival_s)  # only inside the bursts


def test_simulate_trace_format_option(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"  # Mooncake: timestamp in ms
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 4}\n'
                     '{"timestamp": 3000, "input_length": 120, "output_length": 4}\n')
    res = CliRunner().invoke(cli, ["simulate", "--model", "qwen3-1.7b", "--gpu", "H100",
                                   "--trace", str(trace), "--trace-format", "mooncake",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["requests"] == 2
    bad = CliRunner().invoke(cli, ["simulate", "--model", "qwen3-1.7b", "--gpu", "H100",
                                   "--trace", str(trace), "--trace-format", "nope"])
    assert bad.exit_code != 0 and "unknown" in bad.output


def test_simulate_on_a_gpu_of_a_gpus_yaml(tmp_path: Path) -> None:
    """`--gpus-yaml` GPUs are found through the catalog the command builds from the file; the
    built-in catalog stays as it was, so a later run without the file does not know them."""
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  H100-half:\n    base: H100-SXM\n    mem_bw_gbs: 1675\n")
    args = ["simulate", "--model", "qwen3-1.7b", "--gpu", "h100-half", "--rate", "2",
            "--duration", "20", "--input", "256", "--output", "32", "--json"]
    res = CliRunner().invoke(cli, [*args, "--gpus-yaml", str(gpus)])
    assert res.exit_code == 0, res.output
    half = json.loads(res.output)
    assert half["gpu"] == "H100-half"
    full = json.loads(CliRunner().invoke(cli, [*args[:4], "H100-SXM", *args[5:]]).output)
    assert half["mean_tpot_s"] > full["mean_tpot_s"]  # half the bandwidth: slower decode
    again = CliRunner().invoke(cli, args)
    assert again.exit_code != 0 and "unknown GPU 'h100-half'" in again.output


def test_simulate_errors_point_at_the_cli_s_own_options() -> None:
    """An unknown GPU said to call llmfabric.sim.load_gpus_yaml(path), a Python API, and
    the missing --model listed two of the four subcommands."""
    res = CliRunner().invoke(cli, ["simulate", "--model", "llama-3.1-8b", "--gpu", "H1000"])
    assert res.exit_code != 0 and "--gpus-yaml FILE" in res.output
    res = CliRunner().invoke(cli, ["simulate", "--gpu", "H100"])
    assert res.exit_code == 2
    assert "(or use a subcommand: collective, e2e, flying, net)" in res.output
