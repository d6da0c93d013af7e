"""The Slurm client wrapper on Slurm's real output shapes (22.05), with a fake runner."""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Sequence

import pytest

from llmfabric.launch.allocation import allocation_end
from llmfabric.launch.errors import SlurmError
from llmfabric.launch.slurm import Slurm, parse_test_only, parse_time

SCONTROL = ("JobId=7 JobName=llmfabric-sim UserId=root(0) JobState=RUNNING TimeLimit=00:02:00 "
            "StartTime=2026-11-24T02:25:13 EndTime=2026-11-24T02:27:13 Deadline=N/A")


class FakeRunner:
    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], str | None]] = []

    def __call__(self, argv: Sequence[str], stdin: str | None) -> tuple[int, str, str]:
        self.calls.append((list(argv), stdin))
        return self.answers.get(argv[0], (0, "", ""))


def local(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def test_submit_parses_the_job_id_and_sends_the_script_on_stdin() -> None:
    run = FakeRunner({"sbatch": (0, "1234;cluster\n", "")})
    assert Slurm(run).submit("#!/bin/bash\n") == "1234"
    assert run.calls == [(["sbatch", "--parsable"], "#!/bin/bash\n")]


def test_a_rejected_submission_is_slurms_last_line() -> None:
    err = ("sbatch: error: invalid partition specified: nope\n"
           "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    with pytest.raises(SlurmError) as info:
        Slurm(FakeRunner({"sbatch": (1, "", err)})).submit("x")
    assert str(info.value) == "Batch job submission failed: Invalid partition name specified"


def test_queue_rows_and_start_estimates() -> None:
    out = ("12|llmfabric-sim|RUNNING|2026-11-24T02:25:13|2026-11-24T02:27:13|None|vm\n"
           "13|llmfabric-sim|PENDING|2026-11-24T03:00:00|2026-11-24T03:02:00|Resources|\n")
    jobs = Slurm(FakeRunner({"squeue": (0, out, "")})).queue(name="llmfabric-sim")
    assert [(j.job_id, j.state) for j in jobs] == [("12", "RUNNING"), ("13", "PENDING")]
    assert jobs[0].end == local("2026-11-24T02:27:13")
    assert jobs[1].end is None and jobs[1].start == local("2026-11-24T03:00:00")
    assert Slurm(FakeRunner({"squeue": (1, "", "slurm_load_jobs error: Invalid job id "
                                              "specified")})).queue(["99"]) == []


def test_test_only_start_estimate() -> None:
    err = "sbatch: Job 2 to start at 2026-11-24T02:26:12 using 1 processors on nodes vm\n"
    assert parse_test_only(err) == local("2026-11-24T02:26:12")
    assert parse_test_only("sbatch: error: nope") is None
    assert parse_time("N/A") is None and parse_time("Unknown") is None


def test_allocation_end_prefers_the_env_then_scontrol() -> None:
    run = FakeRunner({"scontrol": (0, SCONTROL, "")})
    assert allocation_end({}, run) is None  # not in a job
    assert allocation_end({"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1800000000"},
                          run) == 1800000000.0
    assert run.calls == []
    assert allocation_end({"SLURM_JOB_ID": "7"}, run) == local("2026-11-24T02:27:13")
    assert run.calls[0][0] == ["scontrol", "show", "job", "-o", "7"]
    assert allocation_end({"SLURM_JOB_ID": "7"}, FakeRunner(
        {"scontrol": (1, "", "slurm_load_jobs error: Invalid job id specified")})) is None
    assert allocation_end({"SLURM_JOB_ID": "7"}, FakeRunner(
        {"scontrol": (0, SCONTROL.replace("2026-11-24T02:27:13", "Unknown"), "")})) is None


def test_status_rows_join_the_queue_accounting_and_the_fabric() -> None:
    from llmfabric.cli.slurm import job_rows

    squeue = "12|llmfabric-sim|RUNNING|2026-11-24T02:25:13|2026-11-24T02:27:13|None|vm\n"
    run = FakeRunner({"squeue": (0, squeue, ""),
                      "sacct": (1, "", "Slurm accounting storage is disabled")})
    nodes = [{"session_id": "s-old", "state": "LEFT", "labels": {"slurm_job": "12"},
              "models": []},
             {"session_id": "s-new", "state": "SERVING", "labels": {"slurm_job": "12"},
              "models": [{"id": "m"}], "alloc_end": 5.0},
             {"session_id": "other", "state": "SERVING", "labels": {}, "models": []}]
    rows = job_rows(Slurm(run), ["12", "13"], None, nodes)
    assert [r["job"] for r in rows] == ["12", "13"]
    assert rows[0]["state"] == "RUNNING"
    assert rows[0]["fabric"] == [{"session_id": "s-new", "state": "SERVING",
                                  "suspected": False, "models": ["m"], "alloc_end": 5.0}]
    assert rows[1]["state"] == "GONE" and "accounting storage is disabled" in rows[1]["note"]
    done = FakeRunner({"squeue": (0, "", ""),
                       "sacct": (0, "13|COMPLETED|0:0|00:01:02\n13.batch|COMPLETED|0:0|x\n", "")})
    assert job_rows(Slurm(done), ["13"], None, None) == [
        {"job": "13", "state": "COMPLETED", "exit": "0:0", "elapsed": "00:01:02"}]


def test_status_ignores_malformed_fabric_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import json as _json

    from llmfabric.cli import slurm as cli_slurm

    body = {"nodes": [{"session_id": "ok", "state": "SERVING", "labels": {"slurm_job": "1"},
                       "models": [{"id": "m"}]},
                      {"session_id": "bad", "state": "SERVING", "labels": ["slurm_job"]},
                      {"session_id": 7, "state": "SERVING", "labels": {}},
                      {"session_id": "bad2", "state": "JOIN", "labels": {}, "models": [3]},
                      "junk"]}
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda *a, **k: io.BytesIO(_json.dumps(body).encode()))
    assert [n["session_id"] for n in cli_slurm._fabric_nodes("http://x")] == ["ok"]


def test_status_sends_the_api_key_to_the_ingress(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ingress's fleet views need a key: `slurm status --node URL --api-key K` sends it."""
    import io
    import urllib.request

    from llmfabric.cli import slurm as cli_slurm

    seen: list[str | None] = []

    def urlopen(req: urllib.request.Request, timeout: float = 0) -> io.BytesIO:
        seen.append(req.get_header("Authorization"))
        return io.BytesIO(b'{"nodes": []}')

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.delenv("LLMFABRIC_API_KEY", raising=False)
    assert cli_slurm._fabric_nodes("http://x", "lf-k") == []
    assert seen == ["Bearer lf-k"]


def test_submit_without_slurm_does_not_claim_a_rejection(tmp_path: pathlib.Path) -> None:
    """Off a login node `slurm submit` said 'sbatch rejected the job: sbatch not found'."""
    from click.testing import CliRunner

    from llmfabric.cli import slurm as cli_slurm
    from llmfabric.launch.errors import SlurmTimeout

    profile = pathlib.Path(__file__).parents[3] / "examples" / "slurm-vllm.yaml"
    res = CliRunner().invoke(cli_slurm.command, ["submit", str(profile)],
                             env={"PATH": str(tmp_path)})
    assert res.exit_code == 1
    assert "sbatch not found: run this on a Slurm login node" in res.output
    assert "rejected" not in res.output
    late = cli_slurm._submit_error(SlurmTimeout("sbatch did not answer within 60 s"))
    assert "may have queued the job" in late.message and "rejected" not in late.message
    assert cli_slurm._submit_error(SlurmError("Invalid partition")).message == (
        "sbatch rejected the job: Invalid partition")
    # no Slurm configuration on this machine: sbatch never asked slurmctld (it said rejected)
    fatal = SlurmError("sbatch: fatal: Could not establish a configuration source")
    assert cli_slurm._submit_error(fatal).message == (
        "sbatch could not submit from this machine: sbatch: fatal: Could not establish a "
        "configuration source")


def _fake_slurm_bin(tmp_path: pathlib.Path) -> str:
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n"
                      "echo '12|llmfabric-sim|RUNNING|2026-11-24T02:25:13|2026-11-24T02:27:13"
                      "|None|vm'\n")
    squeue.chmod(0o755)
    return str(tmp_path)


def test_status_table_has_a_header_and_json_has_none(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`slurm status` printed bare rows: which column was the host, which the reason? (On a
    terminal: piped, the rows only, the next test.)"""
    import io
    import json as _json
    import urllib.request

    from click.testing import CliRunner

    from llmfabric.cli import slurm as cli_slurm

    monkeypatch.setattr(cli_slurm, "_is_terminal", lambda: True)
    env = {"PATH": _fake_slurm_bin(tmp_path)}
    res = CliRunner().invoke(cli_slurm.command, ["status", "12"], env=env)
    assert res.exit_code == 0, res.output
    header, row = res.output.splitlines()
    assert header.split() == ["JOB", "STATE", "HOST", "REASON/EXIT"]
    assert row.split()[:3] == ["12", "RUNNING", "vm"]
    assert header.index("STATE") == row.index("RUNNING")  # the columns line up

    body = {"nodes": [{"session_id": "s-1", "state": "SERVING", "labels": {"slurm_job": "12"},
                       "models": [{"id": "m"}]}]}
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda *a, **k: io.BytesIO(_json.dumps(body).encode()))
    res = CliRunner().invoke(cli_slurm.command, ["status", "12", "--node", "http://x"], env=env)
    header, row = res.output.splitlines()
    assert header.split()[-4:] == ["FABRIC", "(state", "models", "session)"]
    assert row.endswith("SERVING m s-1")
    res = CliRunner().invoke(cli_slurm.command, ["status", "12", "--node", "http://x", "--json"],
                             env=env)
    assert [r["job"] for r in _json.loads(res.output)] == ["12"]


def test_piped_status_prints_the_rows_only_and_json_is_unchanged(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header line broke scripts that parse `slurm status | awk ...`: it is for a reader
    at a terminal; piped, the output is the rows, and --json is the same either way."""
    from click.testing import CliRunner

    from llmfabric.cli import slurm as cli_slurm

    env = {"PATH": _fake_slurm_bin(tmp_path)}
    res = CliRunner().invoke(cli_slurm.command, ["status", "12"], env=env)  # (not a tty)
    assert res.exit_code == 0, res.output
    [row] = res.output.splitlines()
    assert row.split()[:3] == ["12", "RUNNING", "vm"]
    piped = CliRunner().invoke(cli_slurm.command, ["status", "12", "--json"], env=env).output
    monkeypatch.setattr(cli_slurm, "_is_terminal", lambda: True)
    assert len(CliRunner().invoke(cli_slurm.command, ["status", "12"],
                                  env=env).output.splitlines()) == 2
    terminal = CliRunner().invoke(cli_slurm.command, ["status", "12", "--json"], env=env).output
    assert terminal == piped and piped.startswith("[")


def test_status_and_cancel_off_a_slurm_machine_say_where_to_run(tmp_path: pathlib.Path) -> None:
    """Where Slurm is installed without its configuration, `slurm status` said only
    'squeue: fatal: Could not establish a configuration source' (submit already said that
    sbatch could not submit from this machine)."""
    from click.testing import CliRunner

    from llmfabric.cli import slurm as cli_slurm

    for tool in ("squeue", "scancel"):
        script = tmp_path / tool
        script.write_text(f"#!/bin/sh\necho '{tool}: fatal: Could not establish a "
                          "configuration source' >&2\nexit 1\n")
        script.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    for args, tool in ((["status", "12"], "squeue"), (["cancel", "12"], "scancel")):
        res = CliRunner().invoke(cli_slurm.command, args, env=env)
        assert res.exit_code == 1
        assert res.output == (f"Error: {tool} could not reach Slurm from this machine: {tool}: "
                              "fatal: Could not establish a configuration source (run this on "
                              "a Slurm login node)\n"), res.output
