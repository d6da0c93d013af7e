"""Data parallelism for the simulated engine: `dp` independent replicas of one model.

A vLLM/SGLang server started with `--data-parallel-size N` runs N engine replicas behind one
API; the simulated engine does the same with N batchers (each with its own prefill queue and
decode loop), each request going to the replica with the fewest requests in progress. So an
engine the fleet controller assigns with tp x dp GPUs has the capacity the plan counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from llmfabric.engines.batcher import Batcher


class DataParallel:
    """The Batcher interface over several replicas (least in-progress requests first)."""

    def __init__(self, replicas: list[Batcher]) -> None:
        if not replicas:
            raise ValueError("data parallelism needs at least one replica")
        self.replicas = replicas
        self._load = [0] * len(replicas)

    @property
    def active(self) -> int:
        return sum(b.active for b in self.replicas)

    @property
    def slow(self) -> float:
        return self.replicas[0].slow

    @slow.setter
    def slow(self, factor: float) -> None:
        for b in self.replicas:
            b.slow = factor

    def pause(self) -> None:
        for b in self.replicas:
            b.pause()

    def resume(self) -> None:
        for b in self.replicas:
            b.resume()

    def _scaled(self, seconds: float) -> float:
        return self.replicas[0]._scaled(seconds)

    async def generate(self, prompt_tokens: int, max_new_tokens: int,
                       cached_tokens: int = 0, prefilled: bool = False) -> AsyncIterator[int]:
        i = min(range(len(self.replicas)), key=self._load.__getitem__)
        self._load[i] += 1
        try:
            replica = self.replicas[i]
            async for token in replica.generate(prompt_tokens, max_new_tokens, cached_tokens,
                                                prefilled):
                yield token
        finally:
            self._load[i] -= 1

    async def aclose(self) -> None:
        for b in self.replicas:
            await b.aclose()
