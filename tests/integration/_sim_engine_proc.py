"""Start `llmfabric engine sim` as a real subprocess for integration tests."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

from llmfabric.net.ports import free_port
from llmfabric.testing.poll import wait_until_sync


def sim_command(port: int, *extra: str, model: str = "llama-3.1-8b") -> list[str]:
    return [sys.executable, "-m", "llmfabric.cli.engine", "sim", "--model", model,
            "--port", str(port), "--speed", "20", *extra]


@contextlib.contextmanager
def running_engine(log: pathlib.Path, *extra: str, model: str = "llama-3.1-8b"
                   ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(sim_command(port, *extra, model=model), stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"sim engine exited: {log.read_text()}")
            with urllib.request.urlopen(f"{base}/health", timeout=1):
                return True

        try:
            wait_until_sync(up, 30, "the sim engine", interval=0.05, ignore=(OSError,))
        except AssertionError:
            raise RuntimeError(f"sim engine did not start: {log.read_text()}") from None
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
