"""The network-namespace lab of the end-to-end tests (root, iproute2, iptables).

A `NetLab` creates uniquely named namespaces (`<prefix><tag><role>`, the prefix set per test
module) and veth links, NATs, delays or rate-limits links, runs commands and processes inside
the namespaces, and removes everything it made (processes, namespaces and with them their
veths, qdiscs and iptables rules). `open_lab` is the one way the tests get one: it skips
where namespaces cannot be made and closes the lab even when the test fails. Only private
subnets (10.x, 192.168.x) are used, and only inside the namespaces the lab created.

`wait_for` polls a predicate (through the suite's one polling helper) and fails with the tail
of every process log; `read_records` reads the JSON-lines files the in-lab clients write;
`start_stream` runs a client script that streams one completion and marks its first chunks;
`keepalive_config` writes the dead-peer tests' keepalive settings (KEEPALIVE: a silent peer is
dead after DEAD_AFTER_S) as a node's config file.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from llmfabric.testing.poll import wait_for_value

REQUIRED = ("ip", "iptables")

# GET a URL from inside a namespace, with an optional bearer key; prints the body.
_GET = (
    "import sys,urllib.request as u;"
    "h={'Authorization':'Bearer '+sys.argv[2]} if sys.argv[2] else {};"
    "print(u.urlopen(u.Request(sys.argv[1],headers=h),timeout=float(sys.argv[3]))"
    ".read().decode())"
)


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
    def __init__(self, prefix: str = "lf") -> None:
        self.prefix = prefix
        self.tag = uuid.uuid4().hex[:6]
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        self._links = 0

    def ns(self, role: str) -> str:
        name = f"{self.prefix}{self.tag}{role}"
        self.run_host("ip", "netns", "add", name)
        self.namespaces.append(name)  # recorded at once: removed even if the next step fails
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

    def nat(self, router: str, subnet: str, uplink: str, downlink: str) -> None:
        """`router` forwards and MASQUERADEs `subnet` out of `uplink`; nothing new comes in
        from `uplink` to `downlink` (outbound-only connectivity, like a home router)."""
        self.run(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.run(
            router, *f"iptables -t nat -A POSTROUTING -s {subnet} -o {uplink} -j MASQUERADE".split()
        )
        self.run(
            router,
            *f"iptables -A FORWARD -i {uplink} -o {downlink} -m conntrack "
            "--ctstate NEW -j DROP".split(),
        )

    def rate_limit(self, ns: str, dev: str, rate: str) -> None:
        """Shape `dev`'s egress to `rate` (tc tbf: works on kernels without sch_netem)."""
        self.run(
            ns, *f"tc qdisc add dev {dev} root tbf rate {rate} burst 32kbit latency 400ms".split()
        )

    def delay(self, ns: str, dev: str, ms: int) -> str | None:
        """`ms` of netem delay on `dev`'s egress; None when applied, else why not (kernels
        without sch_netem, this VM's among them, cannot: the caller decides what that means)."""
        if shutil.which("modprobe"):  # (loaded on demand where it is only unloaded)
            subprocess.run(["modprobe", "sch_netem"], capture_output=True, timeout=30)
        tc = f"tc qdisc add dev {dev} root netem delay {ms}ms".split()
        res = subprocess.run(
            ["ip", "netns", "exec", ns, *tc], capture_output=True, text=True, timeout=30
        )
        if res.returncode != 0:
            return (
                f"`tc qdisc add ... netem delay {ms}ms` failed on kernel "
                f"{platform.release()}: {res.stderr.strip() or res.returncode} (no sch_netem?)"
            )
        shown = self.run(ns, "tc", "qdisc", "show", "dev", dev)
        assert "netem" in shown and f"delay {ms}" in shown, shown
        return None

    def get_json(self, ns: str, url: str, key: str = "", timeout: float = 10) -> Any:
        """GET `url` from inside `ns` (with a bearer `key` if given); the JSON body, or None
        when the request failed (not up yet, refused, an error status)."""
        out = self.run(
            ns,
            sys.executable,
            "-c",
            _GET,
            url,
            key,
            str(timeout),
            check=False,
            timeout=timeout + 20,
        )
        return json.loads(out) if out.strip() else None

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


@contextlib.contextmanager
def open_lab(prefix: str = "lf") -> Iterator[NetLab]:
    """A lab whose namespaces start with `prefix`, closed however the test ends; skips the
    test where network namespaces cannot be made (fails under CI, which runs as root with the
    tools: a skip there would hide a gap)."""
    reason = netns_skip_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI cannot run the network-namespace tests: {reason}")
        pytest.skip(reason)
    lab = NetLab(prefix)
    try:
        yield lab
    finally:
        lab.close()


def wait_for(
    what: str,
    predicate: Callable[[], Any],
    timeout: float,
    logs: pathlib.Path,
    interval: float = 0.5,
) -> Any:
    """Poll until `predicate` returns something truthy and return it; on timeout fail with
    the tail of every `*.log` under `logs` (the lab's processes)."""
    try:
        return wait_for_value(predicate, timeout, what, interval=interval)
    except AssertionError:
        tails = {p.name: p.read_text()[-1500:] for p in logs.glob("*.log")}
        raise AssertionError(f"{what} within {timeout} s: {tails}") from None


def start_stream(
    lab: NetLab, ns: str, script: str, base_url: str, key: str, out: pathlib.Path, model: str,
    tokens: int, log: pathlib.Path, within_s: float = 60.0,
) -> tuple[subprocess.Popen[str], pathlib.Path]:
    """Run `script` (`python -c`, argv: base url, key, out, model, tokens) in `ns`, and wait
    until it wrote `<out>.first` (its stream is under way), it exits, or `within_s` passes.
    Returns the client and that path (which exists only if the stream got under way)."""
    client = lab.popen(
        ns, [sys.executable, "-c", script, base_url, key, str(out), model, str(tokens)],
        str(log))
    first = pathlib.Path(str(out) + ".first")
    deadline = time.monotonic() + within_s
    while not first.exists() and client.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # (the tests time what follows the first chunk)
    return client, first


# The dead-peer tests' keepalive (test_dead_*): idle 2 s, then 2 probes 1 s apart.
KEEPALIVE = {"keepalive_idle_s": 2, "keepalive_interval_s": 1, "keepalive_count": 2}
DEAD_AFTER_S = (KEEPALIVE["keepalive_idle_s"]
                + KEEPALIVE["keepalive_interval_s"] * KEEPALIVE["keepalive_count"])


def keepalive_config(path: pathlib.Path) -> pathlib.Path:
    """KEEPALIVE written to `path` as a node's config file (`start --config`)."""
    path.write_text("".join(f"{k}: {v}\n" for k, v in KEEPALIVE.items()))
    return path


def read_records(path: pathlib.Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file an in-lab client appends to ([] before it exists)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
