"""Run a load: send each RequestSpec at its offset, collect outcomes, stop at a hard deadline.

A run is bounded in count (the specs, built with a request bound) and in time: sending stops at
the last spec's offset, in-flight requests get `drain_s` more seconds, and those still running
then are cancelled and reported as `cancelled` failures. `max_concurrency` caps in-flight
requests (later arrivals wait for a slot, as in `vllm bench serve --max-concurrency`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from llmfabric.bench.client import RequestOutcome, send
from llmfabric.bench.errors import BenchConfigError
from llmfabric.bench.workload import RequestSpec
from llmfabric.clock import Clock, SystemClock


@dataclass(frozen=True, slots=True)
class BenchConfig:
    base_url: str
    endpoint: str = "completions"  # or "chat"
    api_key: str | None = None
    max_concurrency: int | None = None
    request_timeout_s: float = 600.0
    drain_s: float = 60.0
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise BenchConfigError("endpoint must be 'completions' or 'chat'")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchConfigError("max_concurrency must be at least 1 (or None for no cap)")
        if not self.request_timeout_s > 0 or self.drain_s < 0:
            raise BenchConfigError("request_timeout_s must be > 0 and drain_s >= 0")


@dataclass(frozen=True, slots=True)
class RunOutcome:
    outcomes: list[RequestOutcome]
    duration_s: float


async def run_load(
    specs: Sequence[RequestSpec],
    config: BenchConfig,
    *,
    clock: Clock | None = None,
    on_sent: Callable[[RequestSpec], None] | None = None,
    on_done: Callable[[RequestOutcome], None] | None = None,
) -> RunOutcome:
    """Send `specs` against `config.base_url`; returns every outcome (in spec order)."""
    clk: Clock = clock or SystemClock()
    sem = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    results: dict[int, RequestOutcome] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = clk.now()
        last_done = start

        async def one(index: int, spec: RequestSpec) -> None:
            nonlocal last_done
            if sem is not None:
                await sem.acquire()
            try:
                outcome = await send(
                    session,
                    config.base_url,
                    spec,
                    clock=clk,
                    endpoint=config.endpoint,
                    api_key=config.api_key,
                    timeout_s=config.request_timeout_s,
                    ignore_eos=config.ignore_eos,
                )
            finally:
                if sem is not None:
                    sem.release()
            results[index] = outcome
            last_done = clk.now()
            if on_done:
                on_done(outcome)

        for index, spec in enumerate(specs):
            delay = start + spec.offset_s - clk.now()
            if delay > 0:
                await clk.sleep(delay)
            tasks[index] = asyncio.create_task(one(index, spec))
            if on_sent:
                on_sent(spec)
        timer = asyncio.ensure_future(clk.sleep(config.drain_s))
        try:
            pending = {t for t in tasks.values() if not t.done()}
            while pending and not timer.done():
                await asyncio.wait({*pending, timer}, return_when=asyncio.FIRST_COMPLETED)
                pending = {t for t in pending if not t.done()}
        finally:
            timer.cancel()
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        end = clk.now()
        outcomes = []
        for index, spec in enumerate(specs):
            if index in results:
                outcomes.append(results[index])
            else:
                cancelled = RequestOutcome(
                    spec,
                    False,
                    "cancelled",
                    f"still running {config.drain_s} s after the last send",
                )
                outcomes.append(cancelled)
                if on_done:
                    on_done(cancelled)
                last_done = end
    return RunOutcome(outcomes, max(last_done - start, 1e-9))
