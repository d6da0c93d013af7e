"""Helpers for the torch reference engine's tests (test_torchref_*; they skip without torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmfabric.scheduler.switching import Method

if TYPE_CHECKING:
    from llmfabric.engines.torchref.engine import FlyingEngine


def to_width(engine: FlyingEngine, width: int, method: Method = "hard") -> None:
    """Switch `engine` to `width` and step it until the switch has completed."""
    engine.switch(width, method)
    for _ in range(1000):
        engine.step()
        s = engine.sched
        if s.width == width and not s.pending_bind and not s.pending_release:
            return
    raise AssertionError(f"did not reach width {width}")
