"""`llmfabric ingress` in fabric mode: an ingress node that routes over the registry."""

from __future__ import annotations

import os
import pathlib
import secrets
import subprocess
import sys
import time

import openai
import pytest

from llmfabric.net.ports import free_port

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "llmfabric.cli.main"]


def test_fabric_ingress_serves_a_node_that_joined_it(tmp_path: pathlib.Path) -> None:
    secret = secrets.token_urlsafe(24)
    peer, http, engine = free_port(), free_port(), free_port()
    env = {**os.environ, "LLMFABRIC_HOME": str(tmp_path / "ingress")}
    procs = [subprocess.Popen(
        [*CLI, "ingress", "--network-secret", secret, "--listen", f"127.0.0.1:{peer}",
         "--port", str(http), "--no-auth"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    try:
        procs.append(subprocess.Popen(
            [*CLI, "start", "--home", str(tmp_path / "node"), "--listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--network-secret", secret, "--bootstrap",
             f"127.0.0.1:{peer}", "--process", *CLI, "engine", "sim", "--model", "qwen3-1.7b",
             "--port", str(engine), "--speed", "20"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused",
                               max_retries=0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if any(m.id == "qwen3-1.7b" for m in client.models.list()):
                    break
            except openai.APIConnectionError:
                pass
            time.sleep(0.3)
        reply = client.chat.completions.create(
            model="qwen3-1.7b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 2
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def test_ingress_needs_backends_or_a_network() -> None:
    result = subprocess.run([*CLI, "ingress"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--backend" in result.stderr and "--network-secret" in result.stderr
