"""Health-check counting on virtual time: a real (idle) child process, a scripted probe."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

from llmfabric.agent import EngineState, EngineSupervisor, SupervisorConfig
from llmfabric.testing.fake_clock import FakeClock


class ScriptedProbe:
    def __init__(self, health: list[bool]) -> None:
        self.health_results = list(health)
        self.checks = 0

    async def models(self, base_url: str, timeout_s: float) -> list[dict[str, Any]]:
        return [{"id": "m", "max_model_len": 2048}]

    async def health(self, base_url: str, timeout_s: float) -> bool:
        self.checks += 1
        return self.health_results.pop(0) if self.health_results else False

    async def get_text(self, base_url: str, path: str, timeout_s: float) -> str | None:
        return None

    async def get_json(self, base_url: str, path: str, timeout_s: float) -> Any:
        return None

    async def aclose(self) -> None:
        pass


async def test_failures_must_be_consecutive(tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    # fail, fail, ok (resets), fail, fail, fail -> DOWN on the 6th check, not the 3rd
    probe = ScriptedProbe([False, False, True, False, False, False])
    sup = EngineSupervisor(
        SupervisorConfig(command=[sys.executable, "-c", "import time; time.sleep(60)"],
                         log_path=tmp_path / "e.log", engine_url="http://127.0.0.1:9",
                         health_interval_s=10.0, failures_to_down=3),
        clock=clock, probe=probe,
    )
    info = await sup.start()
    assert [m.id for m in info.models] == ["m"] and info.kind == "openai"
    await clock.advance(50.0)
    assert sup.state is EngineState.READY and probe.checks == 5
    await clock.advance(10.0)
    assert sup.state is EngineState.DOWN and probe.checks == 6
    assert sup.history[-1].reason == "3 consecutive health checks failed"
    await clock.advance(100.0)
    assert probe.checks == 6  # no more checks once DOWN
    stop = sup.stop(drain_timeout_s=5.0)
    assert await stop == -15  # python's default SIGTERM action
