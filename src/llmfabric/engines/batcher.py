"""Continuous batching for the simulated engine.

Every running sequence waits on one shared decode loop: each step takes
`timing.decode_step_s(batch, context)` (scaled by `slow / speed`) and then hands every sequence
in the batch one token, as vLLM's scheduler does. Prefills queue behind each other (one at a
time), so time to first token grows under load. `pause()` freezes both (a hung engine).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmfabric.clock import Clock
from llmfabric.engines.timing import TimingModel


@dataclass(eq=False, slots=True)
class _Seq:
    context: int
    ready: asyncio.Queue[None] = field(default_factory=asyncio.Queue)


class Batcher:
    def __init__(self, timing: TimingModel, clock: Clock, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._timing = timing
        self._clock = clock
        self.speed = speed
        self.slow = 1.0
        self._running: set[_Seq] = set()
        self._prefill_lock = asyncio.Lock()
        self._gate = asyncio.Event()
        self._gate.set()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0

    @property
    def active(self) -> int:
        return len(self._running)

    def pause(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def _scaled(self, seconds: float) -> float:
        return seconds * self.slow / self.speed

    async def generate(self, prompt_tokens: int, max_new_tokens: int,
                       cached_tokens: int = 0, prefilled: bool = False) -> AsyncIterator[int]:
        """Yield token indices 0..max_new_tokens-1, each when the engine would produce it.
        `cached_tokens`: prefix-cache hits, only the uncached tail of the prompt is prefilled.
        `prefilled`: the prompt's KV came from a prefill engine (PD disaggregation), so
        there is no prefill here and the first token takes one decode step."""
        if max_new_tokens <= 0:
            return
        seq = _Seq(context=prompt_tokens + 1)
        if not prefilled:
            async with self._prefill_lock:
                await self._gate.wait()
                todo = max(1, prompt_tokens - cached_tokens)
                await self._clock.sleep(self._scaled(self._timing.prefill_s(todo)))
            yield 0
        self._running.add(seq)
        self._ensure_loop()
        try:
            for i in range(0 if prefilled else 1, max_new_tokens):
                await seq.ready.get()
                yield i
        finally:
            self._running.discard(seq)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._decode_loop(), name="sim-decode")

    async def _decode_loop(self) -> None:
        while self._running:
            await self._gate.wait()
            batch = list(self._running)
            ctx = sum(s.context for s in batch)
            await self._clock.sleep(self._scaled(self._timing.decode_step_s(len(batch), ctx)))
            self.steps += 1
            for s in batch:
                if s in self._running:
                    s.context += 1
                    s.ready.put_nowait(None)

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
