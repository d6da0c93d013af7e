"""EngineSupervisor: run the engine command, wait until it serves, watch it, stop it.

    sup = EngineSupervisor(SupervisorConfig(command=argv, log_path=path))
    sup.on_state_change(callback)          # or: async for ev in sup.events(): ...
    info = await sup.start()               # EngineInfo: kind, base_url, models, pid
    ...
    await sup.stop(drain_timeout_s=30)     # SIGTERM the process group, SIGKILL after

States: STARTING -> READY -> DOWN | FATAL, and STOPPING -> STOPPED from any of them.
DOWN: the engine exited, or `failures_to_down` consecutive health checks failed (reported at
once; exit is seen the moment the process ends). FATAL: a fatal pattern appeared in the log:
the node must fail-stop. DOWN and FATAL are final for this engine run: a recovering node
rejoins under a new session (registry lifecycle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from llmfabric.agent.command import EngineCommand, parse_engine_command
from llmfabric.agent.errors import EngineNotReady, EngineStartError
from llmfabric.agent.logwatch import DEFAULT_FATAL_PATTERNS, LogWatcher
from llmfabric.agent.probe import EngineProbe, HttpProbe, ProbeError
from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.registry.records import ServedModel

log = logging.getLogger(__name__)


class EngineState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DOWN = "down"
    FATAL = "fatal"
    STOPPING = "stopping"
    STOPPED = "stopped"


_SEVERITY = {EngineState.STARTING: 0, EngineState.READY: 1, EngineState.DOWN: 2,
             EngineState.FATAL: 3}


@dataclass(frozen=True, slots=True)
class EngineEvent:
    state: EngineState
    reason: str
    at: float  # clock.now()
    exit_code: int | None = None
    log_line: str | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    kind: str
    base_url: str
    models: tuple[ServedModel, ...]
    pid: int
    log_path: pathlib.Path


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    command: Sequence[str]
    log_path: pathlib.Path
    engine_url: str | None = None
    ready_timeout_s: float = 1800.0  # model loads take minutes
    ready_poll_s: float = 1.0
    health_interval_s: float = 5.0
    health_timeout_s: float = 3.0
    failures_to_down: int = 3
    fatal_patterns: tuple[str, ...] = DEFAULT_FATAL_PATTERNS
    log_poll_s: float = 0.25
    env: Mapping[str, str] | None = None  # added to the agent's environment
    cwd: str | None = None
    default_max_context: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)


_QUANT: dict[str, tuple[str, int]] = {
    "awq": ("awq-int4", 4), "awq_marlin": ("awq-int4", 4), "gptq": ("gptq-int4", 4),
    "gptq_marlin": ("gptq-int4", 4), "fp8": ("fp8", 8), "int8": ("int8", 8),
    "w8a8": ("int8", 8), "bitsandbytes": ("bnb-int4", 4), "gguf": ("gguf", 4),
    "int4": ("int4", 4),
}


def quantization_of(argv: Sequence[str]) -> tuple[str, int]:
    """(quantization, bits) from `--quantization X`/`-q X`/`--dtype`; default bf16."""
    args = list(argv)
    for i, a in enumerate(args):
        value = None
        if a in ("--quantization", "-q") and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--quantization="):
            value = a.split("=", 1)[1]
        if value and value.lower() in _QUANT:
            return _QUANT[value.lower()]
    for i, a in enumerate(args):
        if a == "--dtype" and i + 1 < len(args) and args[i + 1] in ("float16", "half", "fp16"):
            return "fp16", 16
    return "bf16", 16


def served_models(data: list[dict[str, Any]], argv: Sequence[str], default_ctx: int
                  ) -> tuple[ServedModel, ...]:
    quant, bits = quantization_of(argv)
    ids = {str(d["id"]) for d in data}
    # vLLM lists each loaded LoRA adapter (--lora-modules) as an entry whose `parent` is
    # the base model: advertised as that model's adapters, not as models of their own.
    adapters: dict[str, list[str]] = {}
    for d in data:
        parent = d.get("parent")
        if isinstance(parent, str) and parent in ids and parent != str(d["id"]):
            adapters.setdefault(parent, []).append(str(d["id"]))
    out = []
    for d in data:
        parent = d.get("parent")
        if isinstance(parent, str) and parent in ids and parent != str(d["id"]):
            continue
        ctx = d.get("max_model_len")
        out.append(ServedModel(
            id=str(d["id"]), quantization=quant, quant_bits=bits,
            max_context=int(ctx) if isinstance(ctx, int) and ctx > 0 else default_ctx,
            adapters=tuple(adapters.get(str(d["id"]), ())),
        ))
    return tuple(out)


class EngineSupervisor:
    def __init__(self, config: SupervisorConfig, *, clock: Clock | None = None,
                 probe: EngineProbe | None = None) -> None:
        if config.failures_to_down < 1:
            raise ValueError("failures_to_down must be at least 1")
        self.config = config
        self.command: EngineCommand = parse_engine_command(config.command, config.engine_url)
        self._clock: Clock = clock or SystemClock()
        self._probe: EngineProbe = probe or HttpProbe()
        self._state = EngineState.STARTING
        self._events: list[EngineEvent] = []
        self._callbacks: list[Callable[[EngineEvent], None]] = []
        self._queues: list[asyncio.Queue[EngineEvent]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: LogWatcher | None = None
        self._state_changed = asyncio.Event()
        self.info: EngineInfo | None = None
        self.exit_code: int | None = None

    # -- observation --------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def history(self) -> list[EngineEvent]:
        return list(self._events)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def log_tail(self, lines: int = 20) -> str:
        if self._watcher is None:
            return ""
        return "\n".join(list(self._watcher.tail)[-lines:])

    def on_state_change(self, callback: Callable[[EngineEvent], None]) -> None:
        """Call `callback(event)` on every state change (synchronously, in order)."""
        self._callbacks.append(callback)

    async def events(self) -> AsyncIterator[EngineEvent]:
        """Every state change from now on; ends after STOPPED."""
        q: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._queues.append(q)
        try:
            while True:
                ev = await q.get()
                yield ev
                if ev.state is EngineState.STOPPED:
                    return
        finally:
            self._queues.remove(q)

    async def wait_for(self, *states: EngineState) -> EngineState:
        """Wait until the state is one of `states` (returns it)."""
        while self._state not in states:
            self._state_changed.clear()
            await self._state_changed.wait()
        return self._state

    def _is(self, state: EngineState) -> bool:
        return self._state is state

    def _transition(self, state: EngineState, reason: str, *, exit_code: int | None = None,
                    line: str | None = None) -> bool:
        cur = self._state
        if cur is EngineState.STOPPED or cur is state:
            return False
        if cur is EngineState.STOPPING and state is not EngineState.STOPPED:
            return False
        if state in _SEVERITY and cur in _SEVERITY and _SEVERITY[state] < _SEVERITY[cur]:
            return False
        self._state = state
        ev = EngineEvent(state, reason, self._clock.now(), exit_code, line)
        self._events.append(ev)
        log.info("engine %s: %s", state.value, reason)
        for cb in list(self._callbacks):
            try:
                cb(ev)
            except Exception:
                log.exception("engine state callback failed")
        for q in self._queues:
            q.put_nowait(ev)
        self._state_changed.set()
        return True

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> EngineInfo:
        """Spawn the engine and wait until /v1/models lists its models.

        Raises EngineStartError (it exited or logged a fatal error first) or EngineNotReady
        (timeout); in both cases the engine has been stopped."""
        cfg = self.config
        offset = await asyncio.to_thread(self._prepare_log)
        logf = await asyncio.to_thread(cfg.log_path.open, "ab")
        env = {**os.environ, **(cfg.env or {})}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command.argv, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, env=env, cwd=cfg.cwd,
            )
        except OSError as exc:
            raise EngineStartError(
                f"cannot run engine command {self.command.argv[0]!r}: {exc}"
            ) from exc
        finally:
            logf.close()
        self._watcher = LogWatcher(cfg.log_path, cfg.fatal_patterns, self._on_fatal,
                                   self._clock, start_offset=offset, interval_s=cfg.log_poll_s)
        self._tasks.append(asyncio.create_task(self._watch_exit(self._proc), name="engine-exit"))
        self._tasks.append(asyncio.create_task(self._watcher.run(), name="engine-log"))
        try:
            info = await self._wait_ready(self._proc.pid)
        except BaseException:
            await self.stop(drain_timeout_s=5.0)
            raise
        self.info = info
        served = ", ".join(m.id for m in info.models)
        self._transition(EngineState.READY, f"{self.command.kind} engine serving {served}")
        self._tasks.append(asyncio.create_task(self._health_loop(), name="engine-health"))
        return info

    def _prepare_log(self) -> int:
        path = self.config.log_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(f"=== llmfabric agent: starting {' '.join(self.command.argv)}\n".encode())
            return f.tell()

    async def _wait_ready(self, pid: int) -> EngineInfo:
        cfg = self.config
        deadline = self._clock.now() + cfg.ready_timeout_s
        last = "no answer yet"
        while True:
            if self._state in (EngineState.DOWN, EngineState.FATAL):
                reason = self._events[-1].reason if self._events else self._state.value
                raise EngineStartError(
                    f"engine failed before it was ready: {reason}\n"
                    f"last log lines ({cfg.log_path}):\n{self.log_tail()}"
                )
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                raise EngineNotReady(
                    f"engine at {self.command.base_url} not ready after "
                    f"{cfg.ready_timeout_s:.0f}s ({last}); raise the readiness timeout for big "
                    f"models, or check {cfg.log_path}"
                )
            try:
                data = await self._probe.models(self.command.base_url,
                                                min(cfg.health_timeout_s, remaining))
                if data:
                    return EngineInfo(
                        kind=self.command.kind, base_url=self.command.base_url,
                        models=served_models(data, self.command.argv, cfg.default_max_context),
                        pid=pid, log_path=cfg.log_path,
                    )
                last = "/v1/models lists no model"
            except ProbeError as exc:
                last = str(exc)
            await self._sleep_or_state(min(cfg.ready_poll_s, max(0.0, remaining)))

    async def _sleep_or_state(self, seconds: float) -> None:
        """Sleep, but wake early when the state changes (exit or fatal log line)."""
        self._state_changed.clear()
        with contextlib.suppress(TimeoutError):
            await with_timeout(self._clock, self._state_changed.wait(), seconds)

    async def _watch_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.exit_code = code
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.scan()  # a fatal line printed just before exiting wins
        if self._state is not EngineState.STOPPING:
            self._transition(EngineState.DOWN, f"engine exited with status {code}",
                             exit_code=code)

    def _on_fatal(self, line: str, pattern: str) -> None:
        self._transition(EngineState.FATAL, f"fatal engine log line (/{pattern}/): {line}",
                         line=line)

    async def _health_loop(self) -> None:
        cfg = self.config
        failures = 0
        while self._is(EngineState.READY):
            await self._clock.sleep(cfg.health_interval_s)
            if not self._is(EngineState.READY):
                return
            ok = await self._probe.health(self.command.base_url, cfg.health_timeout_s)
            failures = 0 if ok else failures + 1
            if failures >= cfg.failures_to_down:
                self._transition(EngineState.DOWN,
                                 f"{failures} consecutive health checks failed")
                return

    async def stop(self, drain_timeout_s: float = 30.0) -> int | None:
        """SIGTERM the engine's process group, wait up to `drain_timeout_s`, then SIGKILL.
        Returns the engine's exit status (None if it never started)."""
        if self._state is EngineState.STOPPED:
            return self.exit_code
        self._transition(EngineState.STOPPING, "stop requested")
        proc = self._proc
        if proc is not None and proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await with_timeout(self._clock, proc.wait(), drain_timeout_s)
            except TimeoutError:
                log.warning("engine ignored SIGTERM for %.0fs; sending SIGKILL", drain_timeout_s)
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # stragglers left in the group
            self.exit_code = proc.returncode
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await self._probe.aclose()
        self._transition(EngineState.STOPPED, f"engine stopped (status {self.exit_code})",
                         exit_code=self.exit_code)
        return self.exit_code


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
