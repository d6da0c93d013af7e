"""An engine process that dies in the middle of TP work fails the step (its peer is stuck in a
collective), instead of hanging the scheduler."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("torch")

from llmfabric.engines.torchref.config import ByteTokenizer, load_config
from llmfabric.engines.torchref.engine import EngineFailure, EngineOptions, FlyingEngine

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(120)
def test_a_dead_tp_member_fails_the_step() -> None:
    opts = EngineOptions(config=load_config("micro-llama"), dp=2, widths=(1, 2), n_blocks=64)
    with FlyingEngine(opts) as eng:
        eng.switch(2, "hard")
        req = eng.submit(ByteTokenizer().encode("doomed"), 500, ignore_eos=True)
        for _ in range(3):
            eng.step()
        assert req.home == (0, 1) and req.finish is None
        os.kill(eng.ready[1]["pid"], signal.SIGKILL)
        with pytest.raises(EngineFailure):
            for _ in range(1000):
                eng.step()
        assert eng.procs[1].wait(timeout=10) == -signal.SIGKILL
