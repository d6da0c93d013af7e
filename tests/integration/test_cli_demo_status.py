"""The README's main command: `llmfabric demo` brings up a fabric that answers, and
`llmfabric status` reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import openai
import pytest

from llmfabric.net.ports import free_port

from ._sdk_clients import tracked

pytestmark = pytest.mark.slow


def test_demo_serves_the_openai_api_and_status_shows_it(tmp_path: object) -> None:
    port = free_port()
    cli = [sys.executable, "-m", "llmfabric.cli.main"]
    proc = subprocess.Popen(
        [*cli, "demo", "--port", str(port), "--duration", "90", "--speed", "20",
         "--node", "llama-3.1-8b@H100-SXM@uni-a", "--node", "qwen3-1.7b@L40S@uni-b"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    key = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"API key:\s+(\S+)", line)
        if match:
            key = match.group(1)
        if "Ctrl-C stops" in line:
            break
    try:
        assert key is not None, "".join(lines)
        client = tracked(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key))
        reply = client.chat.completions.create(
            model="qwen3-1.7b", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 4
        status = subprocess.run(
            [*cli, "status", "--node", f"http://127.0.0.1:{port}", "--json"],
            capture_output=True, text=True, timeout=30,
        )
        assert status.returncode == 0, status.stderr
        assert '"qwen3-1.7b"' in status.stdout and '"SERVING"' in status.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == 0


def test_status_reports_an_unreachable_node_clearly() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "llmfabric.cli.main", "status", "--node",
         f"http://127.0.0.1:{port}", "--timeout", "2"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0
    assert f"cannot reach http://127.0.0.1:{port}" in result.stderr
    assert "--node URL" in result.stderr  # (and says what to do)
