"""`llmfabric bench` against the simulated engine (a real subprocess), directly and through a
real `llmfabric ingress` subprocess, including a replay of a trace file the test writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfabric.bench import (
    BenchConfig,
    OnOff,
    Poisson,
    run_load,
    summarize,
    synthetic_workload,
)
from llmfabric.testing.poll import wait_until_sync

from ._sim_engine_proc import free_port, running_engine

MODEL = "llama-3.1-8b"
CLI = [sys.executable, "-c", "from llmfabric.cli.main import main; main()"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("sim") / "engine.log"
    with running_engine(log) as (base, _):
        yield base


@pytest.fixture(scope="module")
def ingress(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("ingress") / "ingress.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *CLI,
                "ingress",
                "--port",
                str(port),
                "--no-auth",
                "--backend",
                f"{MODEL}={engine.removeprefix('http://')}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"ingress exited: {log_path.read_text()}")
            with urllib.request.urlopen(f"{base}/v1/models", timeout=1):
                return True

        try:
            wait_until_sync(up, 30, "the ingress", interval=0.1, ignore=(OSError,))
        except AssertionError:
            raise RuntimeError(f"ingress did not start: {log_path.read_text()}") from None
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def test_poisson_completions_against_the_sim_engine(engine: str) -> None:
    specs = synthetic_workload(
        Poisson(20.0),
        model=MODEL,
        input_len=64,
        output_len=8,
        max_requests=12,
        max_duration_s=30,
        seed=1,
    )
    run = await run_load(specs, BenchConfig(engine, drain_s=30))
    assert [o.error for o in run.outcomes] == [None] * 12
    # the sim counts 4 characters per token: the synthetic prompts hit the length exactly
    assert [o.prompt_tokens for o in run.outcomes] == [64] * 12
    assert all(o.output_tokens == 8 for o in run.outcomes)  # ignore_eos honoured
    assert all(len(o.itls_s) == 7 for o in run.outcomes)  # one token per chunk
    assert all(0 < (o.ttft_s or 0) < (o.latency_s or 0) for o in run.outcomes)
    result = summarize(run.outcomes, duration_s=run.duration_s)
    assert result["completed"] == 12 and result["total_output_tokens"] == 96
    assert result["mean_tpot_ms"] > 0 and result["mean_itl_ms"] > 0


async def test_onoff_chat_with_concurrency_cap(engine: str) -> None:
    specs = synthetic_workload(
        OnOff(low_s=0.5, high_s=0.5),
        model=MODEL,
        input_len=16,
        output_len=4,
        max_requests=10,
        max_duration_s=10,
        seed=2,
    )
    run = await run_load(specs, BenchConfig(engine, endpoint="chat", max_concurrency=2, drain_s=30))
    assert all(o.ok for o in run.outcomes)
    # chat adds the sim's 4-token template overhead per message
    assert {o.prompt_tokens for o in run.outcomes} == {20}
    assert {o.output_tokens for o in run.outcomes} == {4}


def test_cli_replays_a_trace_through_the_ingress(ingress: str, tmp_path: Path) -> None:
    trace = tmp_path / "mini_mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]},
        {"timestamp": 200, "input_length": 60, "output_length": 6, "hash_ids": [1, 2]},
        {"timestamp": 400, "input_length": 20, "output_length": 3, "hash_ids": [3]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bench.json"
    md = tmp_path / "bench.md"
    proc = subprocess.run(
        [
            *CLI,
            "bench",
            "--base-url",
            ingress,
            "--model",
            MODEL,
            "--arrival",
            "replay",
            "--trace",
            str(trace),
            "--time-scale",
            "0.001",
            "--num-prompts",
            "10",
            "--duration",
            "30",
            "--drain",
            "30",
            "--slo-ttft-ms",
            "60000",
            "--json",
            str(out),
            "--markdown",
            str(md),
            "--save-detailed",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(out.read_text())
    for key in (
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "mean_itl_ms",
        "p99_e2el_ms",
        "request_goodput",
    ):
        assert key in result, key
    assert result["completed"] == 3 and result["failed"] == 0
    assert result["input_lens"] == [40, 60, 20] and result["output_lens"] == [4, 6, 3]
    assert result["slo_attainment"] == 1.0
    assert "| Successful requests | 3 |" in md.read_text()
    assert "Successful requests" in proc.stdout
