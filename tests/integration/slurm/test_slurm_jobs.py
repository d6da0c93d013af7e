"""Provider jobs on a REAL Slurm: `llmfabric slurm submit` renders a profile, sbatch runs
`llmfabric start --process llmfabric engine sim ...`, the node joins an ingress started here,
serves through it, publishes its allocation end, drains and leaves at its time limit (and on
`llmfabric slurm cancel`) with no failed request; a bad partition is one clear error line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import yaml

from llmfabric.launch.local import EngineSpec, LocalFabric
from llmfabric.launch.slurm import parse_time
from llmfabric.testing.poll import wait_for_value

from ._slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

MODEL = "qwen3-1.7b"
SRC = str(pathlib.Path(__file__).resolve().parents[3] / "src")


def cli(slurm: SlurmCluster, *args: str, timeout: float = 60, api_key: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**slurm.env, "PYTHONPATH": SRC}
    if api_key is not None:  # an ingress's fleet views need a key
        env["LLMFABRIC_API_KEY"] = api_key
    return subprocess.run([sys.executable, "-m", "llmfabric.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def write_profile(tmp: pathlib.Path, fabric: LocalFabric, **over: Any) -> pathlib.Path:
    assert fabric.ingress is not None
    secret = tmp / "network.secret"
    secret.write_text(fabric.secret)
    secret.chmod(0o600)
    py = sys.executable
    data: dict[str, Any] = {
        "name": "sim", "time": "2", "signal_lead": 45, "output": str(tmp / "job-%j.out"),
        "engine": [py, "-m", "llmfabric.cli.main", "engine", "sim", "--model", MODEL,
                   "--gpu", "L40S", "--port", "{port}", "--speed", "50"],
        "env": {"PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"},
        "fabric": {"bootstrap": [fabric.ingress.peer_addr], "secret_file": str(secret),
                   "preset": "local", "llmfabric": f"{py} -m llmfabric.cli.main",
                   "home": str(tmp / "home-$SLURM_JOB_ID"), "listen": "127.0.0.1:0",
                   "http_listen": "127.0.0.1:0", "drain_timeout": 5, "provider": "hpc",
                   "args": ["--gpu", "L40S", "--gpu-count", "1", "--gpu-memory", "48"]},
    }
    data.update(over)
    path = tmp / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    """An ingress and one node outside Slurm that stays (the fleet's steady part); shared by
    this module's tests (each looks only at its own job's nodes)."""
    with LocalFabric(tmp_path_factory.mktemp("fabric")) as fab:
        fab.start_ingress()
        fab.add_node(EngineSpec(MODEL, "L40S", speed=50), "anchor")
        fab.wait_serving({MODEL: 1}, timeout=60)
        yield fab


def job_nodes(fabric: LocalFabric, job: str) -> list[dict[str, Any]]:
    assert fabric.ingress is not None
    nodes = fabric.ingress.get_json("/v1/fabric/nodes")["nodes"]
    return [n for n in nodes if n["labels"].get("slurm_job") == job]


def wait_for(what: str, predicate: Any, timeout: float, slurm: SlurmCluster,
             job: str) -> Any:
    try:
        return wait_for_value(predicate, timeout, what, interval=0.3,
                              ignore=(OSError, ValueError, KeyError))
    except AssertionError as exc:
        out = slurm.run("squeue", "-j", job).stdout
        raise AssertionError(f"{exc}; squeue: {out}") from None


def in_queue(slurm: SlurmCluster, job: str) -> bool:
    out = slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
    return bool(out)


class Load:
    """Closed-loop clients through the ingress (no SDK retries): every failure counts."""

    def __init__(self, base_url: str, key: str, workers: int = 3) -> None:
        self.client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0,
                                    timeout=30)
        self.ok = 0
        self.failures: list[str] = []
        self.nodes: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(workers)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
                node = raw.headers.get("x-fabric-node", "?")
                raw.parse()
                self.nodes[node] = self.nodes.get(node, 0) + 1
                self.ok += 1
            except Exception as exc:
                self.failures.append(repr(exc))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=40)


def submit(slurm: SlurmCluster, profile: pathlib.Path) -> str:
    done = cli(slurm, "slurm", "submit", str(profile))
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    assert job.isdigit(), done.stdout
    return job


def test_job_serves_publishes_its_end_and_leaves_at_its_time_limit(
        slurm: SlurmCluster, fabric: LocalFabric, tmp_path: pathlib.Path) -> None:
    assert fabric.ingress is not None
    job = submit(slurm, write_profile(tmp_path, fabric))
    node = wait_for("the job's node SERVING", lambda: [
        n for n in job_nodes(fabric, job) if n["state"] == "SERVING"], 60, slurm, job)[0]
    # Walltime: the record carries the allocation end Slurm reports (22.05 has no
    # SLURM_JOB_END_TIME, so this came from scontrol) and the drain lead of the profile.
    end = parse_time(slurm.run("scontrol", "show", "job", "-o", job).stdout.split(
        "EndTime=")[1].split()[0])
    assert end is not None and abs(node["alloc_end"] - end) < 2
    assert node["drain_lead_s"] == 45
    status = cli(slurm, "slurm", "status", job, "--node", fabric.ingress.http_url, "--json",
                 api_key=fabric.admin_key())
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)[0]
    assert row["state"] == "RUNNING" and row["fabric"][0]["state"] == "SERVING"
    assert row["fabric"][0]["session_id"] == node["session_id"]
    table = cli(slurm, "slurm", "status", job, "--node", fabric.ingress.http_url,
                api_key=fabric.admin_key()).stdout
    # piped: the rows only (the header line is for a terminal)
    assert table.splitlines()[0].split()[:2] == [job, "RUNNING"], table
    assert f"SERVING {MODEL}" in table, table

    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",
                           api_key=fabric.admin_key(), max_retries=0)

    def served_by(max_tokens: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=max_tokens)
        raw.parse()
        return str(raw.headers["x-fabric-node"])

    # A request expected to run past the node's drain moment never goes there; short ones do.
    assert all(served_by(3000) != node["session_id"] for _ in range(6))
    assert any(served_by(4) == node["session_id"] for _ in range(30))

    with Load(fabric.ingress.http_url + "/v1", fabric.admin_key()) as load:
        wait_for("the job to end", lambda: not in_queue(slurm, job), 150, slurm, job)
    assert load.failures == [], load.failures[:3]
    assert load.nodes.get(node["session_id"], 0) > 0 and load.ok > 20
    states = {n["session_id"]: n["state"] for n in job_nodes(fabric, job)}
    assert states[node["session_id"]] == "LEFT"
    log = (tmp_path / f"home-{job}" / "logs" / "engine.log")
    assert log.exists()
    out = (tmp_path / f"job-{job}.out").read_text()
    assert "Traceback" not in out, out[-2000:]


@pytest.mark.parametrize("how", ["llmfabric slurm cancel", "plain scancel"])
def test_cancel_under_load_with_no_failed_request(
        slurm: SlurmCluster, fabric: LocalFabric, tmp_path: pathlib.Path, how: str) -> None:
    """Graceful (only the node gets SIGTERM: it drains) and a plain `scancel` (every process,
    the engine too, gets SIGTERM: requests it drops are retried on another node)."""
    assert fabric.ingress is not None
    job = submit(slurm, write_profile(tmp_path, fabric, time="10"))
    node = wait_for("the job's node SERVING", lambda: [
        n for n in job_nodes(fabric, job) if n["state"] == "SERVING"], 60, slurm, job)[0]
    with Load(fabric.ingress.http_url + "/v1", fabric.admin_key()) as load:
        wait_for("requests on the job's node", lambda: load.nodes.get(node["session_id"]),
                 30, slurm, job)
        if how == "plain scancel":
            assert slurm.run("scancel", job).returncode == 0
        else:
            done = cli(slurm, "slurm", "cancel", job)
            assert done.returncode == 0 and "draining" in done.stdout, done.stderr
        wait_for("the job to end", lambda: not in_queue(slurm, job), 60, slurm, job)
    assert load.failures == [], load.failures[:3]
    assert {n["state"] for n in job_nodes(fabric, job)} == {"LEFT"}


def test_a_bad_partition_is_one_clear_error_line(
        slurm: SlurmCluster, fabric: LocalFabric, tmp_path: pathlib.Path) -> None:
    done = cli(slurm, "slurm", "submit",
               str(write_profile(tmp_path, fabric, partition="no-such-partition")))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Invalid partition" in lines[0] and "sbatch rejected the job" in lines[0]
    assert "Traceback" not in done.stderr
    assert os.environ.get("SLURM_CONF") is None  # the fixture never leaks into this process
    probe = cli(slurm, "slurm", "submit", "--test-only", str(write_profile(tmp_path, fabric)))
    assert probe.returncode == 0 and probe.stdout.startswith("would start at 20"), probe
    assert not slurm.run("squeue", "-h").stdout.strip()  # nothing was submitted
