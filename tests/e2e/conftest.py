"""Helpers for end-to-end tests in network namespaces (root, iproute2, iptables).

`netlab` yields a `NetLab`: it creates uniquely named namespaces and veth links, runs commands
and processes inside them, and always removes everything it made (processes, namespaces and
with them their veths and iptables rules), even when the test fails. Only private subnets
(10.x, 192.168.x) are used, and only inside the namespaces the lab created.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence

import pytest

REQUIRED = ("ip", "iptables")


def _missing_tools() -> list[str]:
    return [t for t in REQUIRED if shutil.which(t) is None]


def _try_install() -> None:
    """As root, install iproute2/iptables with apt when missing (the test set-up step)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None or not _missing_tools():
        return
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "iproute2", "iptables"],
        check=False,
        capture_output=True,
        timeout=300,
    )


def netns_skip_reason() -> str | None:
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    _try_install()
    missing = _missing_tools()
    if missing:
        return f"needs {', '.join(missing)} (apt-get install iproute2 iptables)"
    probe = f"lfprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create network namespaces here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetLab:
    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        self._links = 0

    def ns(self, role: str) -> str:
        name = f"lf{self.tag}{role}"
        self.run_host("ip", "netns", "add", name)
        self.namespaces.append(name)
        self.run(name, "ip", "link", "set", "lo", "up")
        return name

    def link(self, ns_a: str, addr_a: str, ns_b: str, addr_b: str) -> tuple[str, str]:
        """A veth pair between two namespaces with "a.b.c.d/len" addresses; returns names."""
        self._links += 1
        a, b = f"v{self.tag}{self._links}a", f"v{self.tag}{self._links}b"
        self.run_host(
            "ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b
        )
        for ns, dev, addr in ((ns_a, a, addr_a), (ns_b, b, addr_b)):
            self.run(ns, "ip", "addr", "add", addr, "dev", dev)
            self.run(ns, "ip", "link", "set", dev, "up")
        return a, b

    def run_host(self, *cmd: str) -> str:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
        return res.stdout

    def run(self, ns: str, *cmd: str, check: bool = True, timeout: float = 60) -> str:
        res = subprocess.run(
            ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"[{ns}] {' '.join(cmd)} failed ({res.returncode}): {res.stderr}")
        return res.stdout

    def popen(self, ns: str, cmd: Sequence[str], log_path: str) -> subprocess.Popen[str]:
        log = open(log_path, "w")  # noqa: SIM115 - handed to the child, closed with it
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd], stdout=log, stderr=subprocess.STDOUT, text=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for name in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@pytest.fixture
def netlab() -> Iterator[NetLab]:
    reason = netns_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    lab = NetLab()
    try:
        yield lab
    finally:
        lab.close()
