"""A throwaway one-node Slurm cluster for tests: Debian's `slurm-wlm` and `munge`, installed
when missing (root only, apt with a dpkg lock timeout), configured in a temp dir for this
machine: its own munge key and socket, slurmctld/slurmd on free ports, state and logs in the
temp dir, one partition `debug` holding this host. Everything is stopped (by pid) and removed
at exit, even when a test failed.

The node's CPU count is declared larger than the machine's (`SlurmdParameters=config_overrides`)
so a few small jobs run side by side on a 2-core CI runner. No accounting daemon: `sacct`
answers with an error, which `llmfabric slurm status` reports and works around.
Outside CI (env CI unset) the fixture skips when it cannot run Slurm; in CI it fails loudly.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from llmfabric.net.ports import free_port
from llmfabric.testing.poll import wait_until_sync

PACKAGES = ("slurm-wlm", "munge")
_START_TIMEOUT_S = 60.0


class SlurmUnavailable(Exception):
    """Slurm cannot run here; the message is the skip reason (a failure in CI)."""


@dataclass(frozen=True, slots=True)
class SlurmCluster:
    root: pathlib.Path
    conf: pathlib.Path
    node: str
    partition: str = "debug"

    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's client commands (and jobs) need to find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)


def _install() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm is not installed and installing it needs root "
                               "(apt-get install slurm-wlm munge)")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ("-o", "DPkg::Lock::Timeout=600")
    for argv in (["apt-get", *lock, "update", "-q"],
                 ["apt-get", *lock, "install", "-y", "-q", *PACKAGES]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900,
                              check=False)
        if done.returncode != 0:
            raise SlurmUnavailable(f"{' '.join(argv)} failed: {done.stderr.strip()[-400:]}")


def _conf_text(root: pathlib.Path, node: str, ctl_port: int, d_port: int, cpus: int,
               memory_mb: int) -> str:
    return f"""\
ClusterName=llmfabrictest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=30
InactiveLimit=0
SchedulerParameters=bf_interval=1
MessageTimeout=20
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _wait(predicate: object, what: str, log: pathlib.Path) -> None:
    try:
        wait_until_sync(predicate, _START_TIMEOUT_S, what, interval=0.3)  # type: ignore[arg-type]
    except AssertionError:
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        raise RuntimeError(f"{what} did not come up within {_START_TIMEOUT_S:g} s:\n{tail}"
                           ) from None


def _kill_pidfile(path: pathlib.Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(path.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(cpus: int = 16) -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmd must run as root to start jobs (run the tests as root)")
    _install()
    root = pathlib.Path(tempfile.mkdtemp(prefix="llmfabric-slurm-"))
    root.chmod(0o755)
    node = socket.gethostname().split(".")[0]
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    memory_mb = 16 * 1024
    conf.write_text(_conf_text(root, node, free_port(), free_port(), cpus, memory_mb))
    cluster = SlurmCluster(root, conf, node)
    env = cluster.env
    started: list[pathlib.Path] = []
    try:
        munge = root / "munge"
        subprocess.run(
            ["munged", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}",
             f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
             f"--seed-file={munge}/munged.seed"],
            check=True, capture_output=True, timeout=30)
        started.append(munge / "munged.pid")
        _wait(lambda: (munge / "munge.socket").exists(), "munged", munge / "munged.log")
        subprocess.run(["slurmctld", "-f", str(conf), "-i"], check=True, env=env,
                       capture_output=True, timeout=30)
        started.append(root / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, capture_output=True,
                       timeout=30)
        started.append(root / "slurmd.pid")

        def idle() -> bool:
            out = cluster.run("sinfo", "-h", "-o", "%T").stdout
            return out.strip().startswith("idle")

        _wait(idle, "the Slurm node (sinfo: idle)", root / "slurmctld.log")
        yield cluster
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            cluster.run("scancel", "--full", "-u", "root", timeout=10)
        for pidfile in reversed(started):
            _kill_pidfile(pidfile)
        if os.environ.get("LLMFABRIC_KEEP_SLURM") is None:
            shutil.rmtree(root, ignore_errors=True)
