"""`llmfabric controller --launcher slurm` on a REAL Slurm: no job while nobody asks, a job
once the ingress observes demand beyond the fleet's capacity, the job's node joins and serves,
and a replacement is submitted ahead of the job's allocation end (pre-launch)."""

from __future__ import annotations

import contextlib
import pathlib
import signal
import subprocess
import sys
import time

import openai
import pytest

from llmfabric.launch.local import LocalFabric
from llmfabric.testing.poll import wait_until_sync

from ._slurm_cluster import SlurmCluster
from .test_slurm_jobs import MODEL, SRC, job_nodes, write_profile

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def our_jobs(slurm: SlurmCluster) -> list[str]:
    out = slurm.run("squeue", "-h", "--name", "llmfabric-sim", "-o", "%i").stdout
    return out.split()


def test_controller_launches_a_job_when_demand_rises(
        slurm: SlurmCluster, tmp_path: pathlib.Path) -> None:
    with LocalFabric(tmp_path / "fabric") as fab:
        ingress = fab.start_ingress("--demand-interval", "0.5")
        from llmfabric.launch.local import EngineSpec

        fab.add_node(EngineSpec(MODEL, "L40S", speed=50), "anchor")
        fab.wait_serving({MODEL: 1}, timeout=60)
        # 2-minute jobs that drain 45 s before their end; a replacement needs 50 s to serve:
        # a job is due for replacement 25 s after it starts.
        profile = write_profile(tmp_path, fab, time="2", controller={
            "model": MODEL, "capacity_rps": 0.5, "max_jobs": 1, "startup_s": 50,
            "idle_s": 600})
        log = (tmp_path / "controller.log").open("w")
        ctl = subprocess.Popen(
            [sys.executable, "-m", "llmfabric.cli.main", "controller", "--launcher", "slurm",
             "--profile", str(profile), "--bootstrap", ingress.peer_addr,
             "--network-secret", fab.secret, "--preset", "local", "--home",
             str(tmp_path / "ctl"), "--listen", "127.0.0.1:0", "--interval", "1",
             "--settle", "1"],
            env={**slurm.env, "PYTHONPATH": SRC}, stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(6)
            assert our_jobs(slurm) == [], "no demand, no job"
            client = openai.OpenAI(base_url=ingress.http_url + "/v1", api_key=fab.admin_key(),
                                   max_retries=0)
            for _ in range(25):  # ~2.5 req/s over the demand window's first bucket
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            with contextlib.suppress(AssertionError):  # asserted next, with the log
                wait_until_sync(lambda: our_jobs(slurm), 60, interval=0.5)
            jobs = our_jobs(slurm)
            seen_at = time.monotonic()  # (the job started at most ~2 s before: polls)
            assert len(jobs) == 1, (tmp_path / "controller.log").read_text()[-2000:]
            # The first job was submitted for the demand, not as a replacement. (Read when the
            # job shows up, not once its node serves: on a loaded machine that may take longer
            # than the 25 s after which the job is legitimately due for replacement.)
            wait_until_sync(
                lambda: f"submitted Slurm job {jobs[0]}" in (tmp_path / "controller.log")
                .read_text(), 10, "the submission logged", interval=0.2)
            text = (tmp_path / "controller.log").read_text()
            assert "needs" in text and "replacing" not in text, text[-2000:]
            wait_until_sync(
                lambda: any(n["state"] == "SERVING" for n in job_nodes(fab, jobs[0])), 60,
                "the launched job's node serves", interval=0.5, ignore=(OSError, ValueError))
            if time.monotonic() < seen_at + 20:  # still too early for a replacement
                text = (tmp_path / "controller.log").read_text()
                assert "replacing" not in text, text[-2000:]
            with contextlib.suppress(AssertionError):  # asserted next
                wait_until_sync(lambda: len(our_jobs(slurm)) >= 2, 60, interval=0.5)
            assert len(our_jobs(slurm)) == 2 and jobs[0] in our_jobs(slurm), "pre-launch"
            text = (tmp_path / "controller.log").read_text()
            assert "before a new job could serve: replacing" in text, text[-2000:]
        finally:
            ctl.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                ctl.wait(timeout=15)
            if ctl.poll() is None:
                ctl.kill()
            for job in our_jobs(slurm):
                slurm.run("scancel", "--signal=TERM", "--batch", job)
            deadline = time.monotonic() + 30
            while our_jobs(slurm) and time.monotonic() < deadline:
                time.sleep(0.5)
