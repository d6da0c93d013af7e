"""A local fabric of real node processes on loopback: the demo and the multi-process tests.

Each node is a `llmfabric start` subprocess with its own home directory, ports and (for
serving nodes) a supervised simulated engine; nothing is faked but the GPU.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmfabric.identity.admission import encode_public_key, sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.net.ports import free_port


@dataclass(frozen=True, slots=True)
class EngineSpec:
    model: str
    gpu: str
    provider: str = "demo"
    site: str = "local"
    speed: float = 1.0
    gpu_memory_gb: float | None = None


@dataclass(slots=True)
class NodeProcess:
    name: str
    home: pathlib.Path
    peer_port: int
    http_port: int
    proc: subprocess.Popen[bytes]
    engine_port: int | None = None
    log_path: pathlib.Path = field(default_factory=pathlib.Path)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def peer_addr(self) -> str:
        return f"127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get_json(self, path: str, timeout: float = 2.0) -> Any:
        # An ingress's fleet views need an API key: use its admin key when it has one.
        key_file = self.home / "admin.key"
        headers = ({"Authorization": f"Bearer {key_file.read_text().strip()}"}
                   if key_file.exists() else {})
        req = urllib.request.Request(self.http_url + path, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return orjson.loads(resp.read())

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def kill_hard(self) -> None:
        """SIGKILL the node and its engine's process group (as a crashed host would)."""
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.engine_port is not None:
            _kill_listeners(self.engine_port)


def _kill_listeners(port: int) -> None:
    """Kill whatever still listens on `port` (an orphaned engine of a SIGKILLed node)."""
    with contextlib.suppress(FileNotFoundError, subprocess.SubprocessError):
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                             text=True, timeout=5).stdout
        for part in out.split("pid=")[1:]:
            pid = int(part.split(",")[0])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class LocalFabric:
    """Start with `start_ingress()` then `add_node(...)`; `close()` stops everything."""

    def __init__(
        self,
        root: pathlib.Path,
        *,
        preset: str = "local",
        auth: bool = True,
        secret: str | None = None,
        python: str = sys.executable,
        ingress_http_port: int | None = None,
        operator: NodeKey | None = None,
    ) -> None:
        """With `operator`, the fabric is a certificate network: every node gets a membership
        certificate signed by it (naming `cert_providers[name]` as its provider, if set)
        instead of the network secret."""
        self.operator = operator
        self.cert_providers: dict[str, str] = {}
        self.root = root
        self.preset = preset
        self.auth = auth
        self.secret = secret or secrets.token_urlsafe(24)
        self.python = python
        self.ingress_http_port = ingress_http_port
        self.nodes: list[NodeProcess] = []
        self.ingress: NodeProcess | None = None

    # ---- processes ----------------------------------------------------------------------
    def _cli(self) -> list[str]:
        return [self.python, "-m", "llmfabric.cli.main"]

    def _spawn(
        self, name: str, args: Sequence[str], http_port: int | None = None,
        engine_port: int | None = None,
    ) -> NodeProcess:
        home = self.root / name
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        peer_port, http_port = free_port(), http_port or free_port()
        log_path = home / "node.log"
        cmd = [
            *self._cli(), "start", "--home", str(home),
            "--listen", f"127.0.0.1:{peer_port}", "--http-listen", f"127.0.0.1:{http_port}",
            *self._credential(name, home), "--preset", self.preset, *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.operator is None:
            # In the environment, not argv: any user of the host reads a process's argv
            # (ps, /proc/PID/cmdline), and the demo's loopback ports are theirs to dial too.
            env["LLMFABRIC_NETWORK_SECRET"] = self.secret
        with log_path.open("ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL)
        node = NodeProcess(name, home, peer_port, http_port, proc, engine_port, log_path)
        self.nodes.append(node)
        return node

    def _credential(self, name: str, home: pathlib.Path) -> list[str]:
        if self.operator is None:
            return []  # the secret is in the environment (`_spawn`)
        key, _ = NodeKey.load_or_create(home)
        cert = sign_membership(self.operator, key.peer_id, "default", time.time() + 86400,
                               provider=self.cert_providers.get(name, ""))
        path = home / "member.json"
        path.write_text(cert.to_json())
        return ["--membership-cert", str(path), "--operator-key",
                encode_public_key(self.operator.public_bytes)]

    def start_ingress(self, *extra: str, relay: bool = True) -> NodeProcess:
        """The bootstrap ingress; `relay=False` leaves relaying to other nodes (a relayed
        node then reaches the ingress only through them)."""
        args = ["--ingress", *(["--relay"] if relay else []), "--tier", "stable",
                "--provider", "fabric", *extra]
        if not self.auth:
            args.append("--no-auth")
        self.ingress = self._spawn("ingress", args, http_port=self.ingress_http_port)
        self.wait_http(self.ingress)
        return self.ingress

    def add_node(self, spec: EngineSpec, name: str | None = None, *extra: str,
                 bootstrap: NodeProcess | None = None) -> NodeProcess:
        """A serving node; it joins through `bootstrap` (default: the ingress)."""
        if self.ingress is None:
            raise RuntimeError("start_ingress() first: it is the bootstrap peer")
        boot = bootstrap or self.ingress
        engine_port = free_port()
        name = name or f"node{len(self.nodes)}"
        gpu_args = ["--gpu", spec.gpu, "--gpu-count", "1"]
        if spec.gpu_memory_gb is not None:
            gpu_args += ["--gpu-memory", str(spec.gpu_memory_gb)]
        args = [
            "--bootstrap", boot.peer_addr, "--provider", spec.provider,
            "--label", f"site={spec.site}", *gpu_args, *extra, "--process", *self._cli(),
            "engine", "sim", "--model", spec.model, "--gpu", spec.gpu,
            "--port", str(engine_port), "--speed", str(spec.speed),
        ]
        return self._spawn(name, args, engine_port=engine_port)

    def add_process_node(self, command: Sequence[str], name: str | None = None, *extra: str,
                         engine_port: int | None = None) -> NodeProcess:
        """A node supervising any engine `command` (a real vLLM, llama.cpp, ...)."""
        if self.ingress is None:
            raise RuntimeError("start_ingress() first: it is the bootstrap peer")
        name = name or f"node{len(self.nodes)}"
        args = ["--bootstrap", self.ingress.peer_addr, *extra, "--process", *command]
        return self._spawn(name, args, engine_port=engine_port)

    def add_bare_node(self, name: str | None = None, *extra: str,
                      bootstrap: NodeProcess | None = None) -> NodeProcess:
        """A node without an engine; it joins through `bootstrap` (default: the ingress;
        with neither, it is the seed that later nodes join through)."""
        boot = bootstrap or self.ingress
        name = name or f"node{len(self.nodes)}"
        return self._spawn(name, [*(["--bootstrap", boot.peer_addr] if boot else []), *extra])

    # ---- waiting ------------------------------------------------------------------------
    def wait_http(self, node: NodeProcess, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"{node.name} exited: {self.tail(node)}")
            with contextlib.suppress(OSError, ValueError):
                node.get_json("/healthz", timeout=1.0)
                return
            time.sleep(0.1)
        raise TimeoutError(f"{node.name} did not serve HTTP within {timeout}s: {self.tail(node)}")

    def serving_models(self, via: NodeProcess | None = None) -> dict[str, int]:
        node = via or self.ingress
        if node is None:
            return {}
        models = node.get_json("/v1/fabric/models")["models"]
        return {m["id"]: m["serving"] for m in models}

    def wait_serving(
        self, expected: dict[str, int], timeout: float = 60.0, via: NodeProcess | None = None
    ) -> None:
        """Wait until the replica of `via` (default: the ingress) shows `expected` model ->
        number of routable nodes."""
        deadline = time.monotonic() + timeout
        seen: dict[str, int] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                seen = self.serving_models(via)
                if all(seen.get(m, 0) >= n for m, n in expected.items()):
                    return
            for node in self.nodes:
                if not node.alive() and node.proc.returncode not in (0, -9, -15):
                    raise RuntimeError(f"{node.name} exited: {self.tail(node)}")
            time.sleep(0.2)
        raise TimeoutError(f"models not serving within {timeout}s: want {expected}, saw {seen}")

    def admin_key(self) -> str:
        if self.ingress is None:
            raise RuntimeError("no ingress")
        return (self.ingress.home / "admin.key").read_text().strip()

    @staticmethod
    def tail(node: NodeProcess, lines: int = 30) -> str:
        try:
            text = node.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    # ---- stopping -----------------------------------------------------------------------
    def close(self, timeout: float = 20.0) -> None:
        """SIGTERM every node (graceful leave + engine stop), SIGKILL what is left."""
        for node in self.nodes:
            if node.alive():
                node.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                node.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                node.kill_hard()
            if node.engine_port is not None:
                _kill_listeners(node.engine_port)

    def __enter__(self) -> LocalFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
