"""Flying Serving for the simulated engine (`llmfabric engine sim --flying`): DP batchers
that merge into TP batchers under a switching policy (sim/switching.py, the same policies as
the torch engine), so the fabric, controller and dashboard can see width changes.

`dp` DP batchers (TP = tp each) and, for every aligned group of an allowed width, one TP
batcher timed as TP = w x tp. A control loop on the injected clock runs the policy every
`interval_s` and applies its Bind/Release actions: while a group is bound, new requests for
its members go to its TP batcher; requests already running stay where they started and
finish there (the simulated engine has no KV to move: a "sequential" switch). `/dtp_status`
mirrors the torch engine's shape (width, groups, mode_since, switches).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from llmfabric.clock import Clock
from llmfabric.engines.batcher import Batcher
from llmfabric.sim.switching import (
    Bind,
    Method,
    Release,
    SwitchPolicy,
    SwitchState,
    actions_for_width,
    aligned_groups,
    ewma_rate,
)


class FlyingDataParallel:
    """The Batcher interface over DP batchers that bind into TP batchers online."""

    def __init__(self, make_batcher: Callable[[int], Batcher], dp: int,
                 widths: tuple[int, ...], policy: SwitchPolicy | None, clock: Clock,
                 interval_s: float = 0.1) -> None:
        self.widths = tuple(sorted(set(widths) | {1}))
        self.groups_all = aligned_groups(dp, self.widths)  # raises on a bad width
        self.dp = dp
        self.clock = clock
        self.policy = policy
        self.interval_s = interval_s
        self.engines = [make_batcher(1) for _ in range(dp)]
        self.tp = {g: make_batcher(len(g)) for g in self.groups_all}
        self.bound: list[tuple[int, ...]] = []
        self._load = [0] * dp  # requests in progress routed to each engine (DP or via group)
        self._arrivals = 0
        self.rate = 0.0
        self.started = clock.now()
        self.mode_since = 0.0
        self.switches: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    # -- Batcher interface ----------------------------------------------------------------
    @property
    def active(self) -> int:
        return sum(b.active for b in self._all())

    @property
    def slow(self) -> float:
        return self.engines[0].slow

    @slow.setter
    def slow(self, factor: float) -> None:
        for b in self._all():
            b.slow = factor

    def pause(self) -> None:
        for b in self._all():
            b.pause()

    def resume(self) -> None:
        for b in self._all():
            b.resume()

    def _scaled(self, seconds: float) -> float:
        return self.engines[0]._scaled(seconds)

    def _all(self) -> list[Batcher]:
        return [*self.engines, *self.tp.values()]

    async def generate(self, prompt_tokens: int, max_new_tokens: int,
                       cached_tokens: int = 0, prefilled: bool = False) -> AsyncIterator[int]:
        self._ensure_loop()
        self._arrivals += 1
        e = min(range(self.dp), key=lambda i: (self._load[i] / len(self._group_of(i)), i))
        group = self._group_of(e)
        batcher = self.tp[group] if len(group) > 1 else self.engines[e]
        for m in group:
            self._load[m] += 1
        try:
            async for token in batcher.generate(prompt_tokens, max_new_tokens, cached_tokens,
                                                prefilled):
                yield token
        finally:
            for m in group:
                self._load[m] -= 1

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for b in self._all():
            await b.aclose()

    # -- switching ------------------------------------------------------------------------
    def _group_of(self, e: int) -> tuple[int, ...]:
        for g in self.bound:
            if e in g:
                return g
        return (e,)

    @property
    def width(self) -> int:
        return max((len(g) for g in self.bound), default=1)

    def state(self) -> SwitchState:
        now = self.clock.now() - self.started
        singles = [(e,) for e in range(self.dp) if len(self._group_of(e)) == 1]
        running = tuple(self.engines[e].active for e in range(self.dp))
        return SwitchState(self.width, tuple(sorted([*self.bound, *singles])),
                           tuple(0 for _ in range(self.dp)), running,
                           tuple(1 << 30 for _ in range(self.dp)), self.widths, now,
                           self.mode_since, self.rate)

    def switch(self, width: int, method: Method = "sequential") -> None:
        """Move every engine into aligned groups of `width` (an operator's /dtp_switch)."""
        if width not in self.widths:
            raise ValueError(f"width {width} is not one of {self.widths}")
        self.apply(actions_for_width(self.state(), width, method))

    def apply(self, actions: list[Bind | Release]) -> None:
        changed = False
        for act in actions:
            if isinstance(act, Release) and act.engines in self.bound:
                self.bound.remove(act.engines)
                changed = True
            elif (isinstance(act, Bind) and act.engines in self.tp
                  and not any(set(act.engines) & set(g) for g in self.bound)):
                self.bound.append(act.engines)
                changed = True
        if changed:
            self.mode_since = self.clock.now() - self.started
            self.switches.append({"t": self.mode_since, "width": self.width,
                                  "groups": [list(g) for g in sorted(self.bound)]})

    def _ensure_loop(self) -> None:
        if self.policy is not None and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._control_loop(), name="sim-flying")

    async def _control_loop(self) -> None:
        assert self.policy is not None
        while True:
            await self.clock.sleep(self.interval_s)
            self.rate = ewma_rate(self.rate, self.interval_s, self._arrivals)
            self._arrivals = 0
            self.apply(self.policy(self.state()))

    def status(self) -> dict[str, Any]:
        """The torch engine's /dtp_status shape (without its KV pool and process groups)."""
        return {"width": self.width, "widths": list(self.widths), "engines": self.dp,
                "groups": [list(g) for g in sorted(self.bound)],
                "mode_since": self.mode_since, "switches": len(self.switches),
                "history": self.switches[-20:], "arrival_rate": self.rate,
                "running": [b.active for b in self.engines],
                "running_tp": {"-".join(map(str, g)): b.active for g, b in self.tp.items()}}
