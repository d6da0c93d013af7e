"""The agent supervising real `llmfabric engine sim` subprocesses over loopback."""

from __future__ import annotations

import asyncio
import pathlib
import sys

import aiohttp
import pytest

from llmfabric.agent import (
    EngineNotReady,
    EngineStartError,
    EngineState,
    EngineSupervisor,
    SupervisorConfig,
)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _sim_engine_proc import free_port, sim_command


def config(tmp_path: pathlib.Path, *extra: str, **kw: object) -> SupervisorConfig:
    port = free_port()
    defaults: dict[str, object] = {"ready_poll_s": 0.1, "health_interval_s": 30.0,
                                   "health_timeout_s": 0.5, "log_poll_s": 0.05}
    defaults.update(kw)
    return SupervisorConfig(command=sim_command(port, *extra), log_path=tmp_path / "engine.log",
                            **defaults)  # type: ignore[arg-type]


async def control(base_url: str, body: dict[str, object]) -> None:
    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(f"{base_url}/sim/control", json=body) as r:
                assert r.status == 200
        except aiohttp.ClientConnectionError:
            pass  # "crash" may cut the answer short


async def test_ready_models_and_graceful_stop(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path, "--max-model-len", "8192"))
    seen: list[EngineState] = []
    sup.on_state_change(lambda ev: seen.append(ev.state))
    info = await sup.start()
    assert info.kind == "sim"
    assert [(m.id, m.max_context) for m in info.models] == [("llama-3.1-8b", 8192)]
    assert sup.state is EngineState.READY
    assert "Uvicorn running" in (tmp_path / "engine.log").read_text()
    code = await sup.stop(drain_timeout_s=10)
    assert code == 0  # the engine exited on SIGTERM by itself
    assert seen == [EngineState.READY, EngineState.STOPPING, EngineState.STOPPED]


async def test_crash_is_down_at_once(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path))  # health checks every 30 s: exit must be seen
    info = await sup.start()
    events = sup.events()
    await control(info.base_url, {"action": "crash", "code": 7})
    ev = await asyncio.wait_for(anext(events), 2.0)  # the bound: DOWN within 2 s
    assert ev.state is EngineState.DOWN and ev.exit_code == 7
    await sup.stop()
    assert (await asyncio.wait_for(anext(events), 2.0)).state is EngineState.STOPPING
    await events.aclose()


async def test_hang_is_down_after_failed_health_checks(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path, health_interval_s=0.1, health_timeout_s=0.2,
                                  failures_to_down=3))
    info = await sup.start()
    await control(info.base_url, {"action": "hang"})
    assert await asyncio.wait_for(sup.wait_for(EngineState.DOWN), 10) is EngineState.DOWN
    assert "3 consecutive health checks failed" in sup.history[-1].reason
    assert sup.pid is not None
    await sup.stop(drain_timeout_s=1)  # a hung engine does not finish its shutdown: SIGKILL


async def test_fatal_log_pattern(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path))
    info = await sup.start()
    line = ("[rank0]:[E ProcessGroupNCCL.cpp:1316] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600030 milliseconds")
    await control(info.base_url, {"action": "log", "line": line})
    await asyncio.wait_for(sup.wait_for(EngineState.FATAL), 10)
    assert sup.history[-1].log_line == line
    await sup.stop(drain_timeout_s=5)
    assert sup.state is EngineState.STOPPED


async def test_sigkill_after_drain_timeout(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path, "--ignore-sigterm"))
    await sup.start()
    code = await sup.stop(drain_timeout_s=0.5)
    assert code == -9
    assert "ignoring SIGTERM" in (tmp_path / "engine.log").read_text()


async def test_exit_before_ready_reports_log(tmp_path: pathlib.Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('weights not found', flush=True); "
           "sys.exit(2)"]
    sup = EngineSupervisor(SupervisorConfig(command=cmd, log_path=tmp_path / "e.log",
                                            engine_url=f"http://127.0.0.1:{free_port()}",
                                            ready_poll_s=0.1))
    with pytest.raises(EngineStartError, match="weights not found"):
        await sup.start()
    assert sup.state is EngineState.STOPPED and sup.exit_code == 2


async def test_ready_timeout_stops_engine(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(config(tmp_path, "--startup-delay", "60", ready_timeout_s=1.0))
    with pytest.raises(EngineNotReady, match="not ready"):
        await sup.start()
    assert sup.state is EngineState.STOPPED and sup.exit_code is not None


async def test_missing_binary(tmp_path: pathlib.Path) -> None:
    sup = EngineSupervisor(SupervisorConfig(command=["/nonexistent/vllm", "serve", "m"],
                                            log_path=tmp_path / "e.log"))
    with pytest.raises(EngineStartError, match="cannot run"):
        await sup.start()


async def test_sigterm_lets_inflight_stream_finish(tmp_path: pathlib.Path) -> None:
    cmd = [*sim_command(free_port()), "--speed", "1"]  # last --speed wins: real pace
    sup = EngineSupervisor(SupervisorConfig(command=cmd, log_path=tmp_path / "e.log",
                                            ready_poll_s=0.1, health_interval_s=30.0))
    info = await sup.start()
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 60, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{info.base_url}/v1/chat/completions", json=body) as r,
    ):
        first = await r.content.readline()
        assert first.startswith(b"data: ")
        stopping = asyncio.create_task(sup.stop(drain_timeout_s=20))
        rest = await r.content.read()
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert rest.count(b'"content"') == 60  # every token arrived after SIGTERM
    assert await stopping == 0
