"""Profiles and sbatch rendering: every directive the profile asks for, the secret read from
its file, values quoted (a profile cannot inject shell), bash accepts the script."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from llmfabric.launch.errors import ProfileError
from llmfabric.launch.profile import parse_profile, time_limit_s
from llmfabric.launch.sbatch import render_sbatch


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "llama", "partition": "gpu", "account": "proj", "gpus": 4, "gpu_type": "a100",
        "cpus": 16, "memory": "128G", "time": "04:00:00", "modules": ["cuda/12.4"],
        "engine": "vllm serve meta-llama/Llama-3.1-8B-Instruct --port {port}",
        "fabric": {"bootstrap": "a.example:7946, b.example:7946",
                   "secret_file": "~/.llmfabric/net.secret", "labels": {"site": "hpc"}},
        "signal_lead": 90,
    }
    data.update(over)
    return data


def test_directives_and_node_command() -> None:
    script = render_sbatch(parse_profile(base()))
    for line in ("#SBATCH --job-name=llmfabric-llama", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --gres=gpu:a100:4",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --mem=128G", "#SBATCH --time=04:00:00",
                 "#SBATCH --signal=B:TERM@90", "module load cuda/12.4"):
        assert line in script.splitlines()
    exec_line = script.splitlines()[-1]
    assert exec_line.startswith("exec llmfabric start ")
    assert "--bootstrap a.example:7946 --bootstrap b.example:7946" in exec_line
    assert "--drain-lead 90" in exec_line and '"slurm_job=$SLURM_JOB_ID"' in exec_line
    assert exec_line.endswith('--process vllm serve meta-llama/Llama-3.1-8B-Instruct '
                              '--port "$LLMFABRIC_ENGINE_PORT"')
    # The secret is read from its file at run time, never written into the script.
    assert 'secret_file="$HOME/.llmfabric/net.secret"' in script
    assert 'LLMFABRIC_NETWORK_SECRET="$(cat "$secret_file")"' in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_parses_the_script() -> None:
    script = render_sbatch(parse_profile(base(container={
        "runtime": "apptainer", "image": "docker://vllm/vllm-openai:latest",
        "mounts": ["/scratch:/scratch"]})))
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "--process apptainer exec --nv --bind /scratch:/scratch " \
           "docker://vllm/vllm-openai:latest vllm serve" in script


@pytest.mark.parametrize(("runtime", "expect"), [
    ("enroot", "--process enroot start --rw --mount /d:/d img vllm"),
    ("pyxis", "--process srun --ntasks=1 --container-image=img --container-mounts=/d:/d vllm"),
])
def test_container_runtimes(runtime: str, expect: str) -> None:
    script = render_sbatch(parse_profile(base(
        container={"runtime": runtime, "image": "img", "mounts": ["/d:/d"]})))
    assert expect in script


def test_hostile_values_are_quoted_or_refused() -> None:
    script = render_sbatch(parse_profile(base(
        engine=["vllm", "serve", "m; rm -rf /", "$(touch /tmp/x)"],
        env={"HF_HOME": "/x; echo pwned"})))
    assert "'m; rm -rf /' '$(touch /tmp/x)'" in script
    assert "export HF_HOME='/x; echo pwned'" in script
    with pytest.raises(ProfileError, match="secret_file"):
        render_sbatch(parse_profile(base(fabric={"bootstrap": ["a:1"],
                                                 "secret_file": "$(cat /etc/shadow)"})))
    # an #SBATCH value: Slurm splits directive words on any whitespace, '#' ends the line,
    # '\\' escapes even in quotes: each of these would have carried a directive of its own
    for field, value in (("partition", "gpu\n#SBATCH --account=other"),
                         ("partition", "gpu\t--account=someone-elses-grant"),
                         ("qos", "normal\v--exclusive"), ("account", "proj#2"),
                         ("output", "log\\"), ("constraint", "a b"),
                         ("sbatch", ["--mail-user='x --account=y'"])):
        with pytest.raises(ProfileError, match="an #SBATCH value"):
            parse_profile(base(**{field: value}))
    ok = parse_profile(base(constraint="a100&ib|[r1|r2]", output="logs/%x-%j.out",
                            sbatch=["--exclusive", "--mail-type=END"]))
    assert "#SBATCH --constraint=a100&ib|[r1|r2]" in render_sbatch(ok)
    with pytest.raises(ProfileError, match="secret_file"):  # ${VAR@P} runs a prompt expansion
        render_sbatch(parse_profile(base(fabric={"bootstrap": ["a:1"],
                                                 "secret_file": "${HOSTINFO@P}"})))
    for bad in ({"engine": ["serve", "a\rb"]}, {"env": {"X": "1\n2"}},
                {"fabric": {"bootstrap": ["a:1"], "secret_file": "/s", "labels": {"k": "v\n"}}}):
        with pytest.raises(ProfileError, match="one line"):
            parse_profile(base(**bad))
    with pytest.raises(ProfileError, match="sbatch option"):
        parse_profile(base(sbatch=["exclusive"]))
    # A trailing newline passed every check ('$' matches before a final newline) and ended
    # up as an extra line in the script; a job name with one never matched squeue again, so
    # the launcher would have resubmitted jobs without end.
    for field, value in (("name", "llama\n"), ("time", "60\n"), ("partition", "gpu\n"),
                         ("memory", "64G\n")):
        with pytest.raises(ProfileError):
            parse_profile(base(**{field: value}))
    # infinities rendered as `--drain-timeout inf` and sized fleets with them
    for bad in ({"fabric": {"bootstrap": ["a:1"], "secret_file": "/s",
                            "drain_timeout": float("inf")}},
                {"controller": {"model": "m", "capacity_rps": float("inf")}},
                {"controller": {"model": "m", "capacity_rps": 1.0, "startup_s": float("nan")}}):
        with pytest.raises(ProfileError):
            parse_profile(base(**bad))


def test_profile_errors_name_the_field() -> None:
    with pytest.raises(ProfileError, match="time"):
        parse_profile(base(time="soon"))
    with pytest.raises(ProfileError, match="memory"):
        parse_profile(base(memory="lots"))
    with pytest.raises(ProfileError, match="fabric"):
        parse_profile(base(fabric={"secret_file": "x"}))
    with pytest.raises(ProfileError, match="signal_lead"):
        parse_profile(base(time="2", signal_lead=120))
    with pytest.raises(ProfileError, match="surprise"):
        parse_profile(base(surprise=1))


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("1:30", 90), ("01:00:00", 3600), ("2-00", 172800), ("1-01:02:03", 90123)])
def test_time_limits(text: str, seconds: int) -> None:
    assert time_limit_s(text) == seconds


def test_an_unknown_profile_key_is_named_as_such() -> None:
    """A typo said 'Extra inputs are not permitted' (pydantic's words)."""
    with pytest.raises(ProfileError, match=r"partiton: unknown key \(the keys: docs/deploy-slurm"):
        parse_profile(base(partiton="gpu"))
