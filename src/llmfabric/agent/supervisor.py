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
import dataclasses
import os
import pathlib
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from llmfabric.agent.command import EngineCommand, parse_engine_command
from llmfabric.agent.engine_metrics import (
    EngineLoad,
    PrefixRate,
    load_from_metrics,
    load_from_slots,
)
from llmfabric.agent.engines import engine_phrase
from llmfabric.agent.errors import EngineNotReady, EngineStartError
from llmfabric.agent.facts import props_context, role_of, served_models
from llmfabric.agent.logwatch import DEFAULT_FATAL_PATTERNS, LogWatcher
from llmfabric.agent.probe import EngineProbe, HttpProbe, ProbeError, error_text
from llmfabric.agent.proctree import (
    descendants,
    engine_preexec,
    kill_tree,
    watchdog_command,
)
from llmfabric.clock import Clock, SystemClock, with_timeout
from llmfabric.registry.records import ModelRole, ServedModel
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


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
    engine_kind: str | None = None  # `--engine KIND`; None: detected from the command
    model_ids: tuple[str, ...] = ()  # `--model-id`: served ids the engine does not list
    progress_interval_s: float = 15.0  # "still waiting for the engine" log lines
    watchdog: bool = True  # kill the whole tree when the node or the main process dies


class EngineSupervisor:
    def __init__(self, config: SupervisorConfig, *, clock: Clock | None = None,
                 probe: EngineProbe | None = None) -> None:
        if config.failures_to_down < 1:
            raise ValueError("failures_to_down must be at least 1")
        self.config = config
        self.command: EngineCommand = parse_engine_command(
            config.command, config.engine_url, config.engine_kind)
        self._clock: Clock = clock or SystemClock()
        self._probe: EngineProbe = probe or HttpProbe()
        self._state = EngineState.STARTING
        self._events: list[EngineEvent] = []
        self._callbacks: list[Callable[[EngineEvent], None]] = []
        self.callback_errors = 0  # state callbacks that raised (each logged with its traceback)
        self._queues: list[asyncio.Queue[EngineEvent]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: LogWatcher | None = None
        self._state_changed = asyncio.Event()
        self.info: EngineInfo | None = None
        self.exit_code: int | None = None
        self._watchdog: asyncio.subprocess.Process | None = None
        self._known: dict[int, int] = {}  # descendants seen (pid -> start time)
        self._prefix = PrefixRate()
        self._started_at = 0.0

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
                self.callback_errors += 1
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
        self._started_at = self._clock.now()
        log.info("starting %s: %s", engine_phrase(self.command.kind), " ".join(self.command.argv))
        try:
            # Own process group (we signal the whole tree) + parent-death SIGKILL (a node
            # killed with -9 takes its engine along): agent/proctree.py.
            self._proc = await asyncio.create_subprocess_exec(
                *self.command.argv, stdout=logf, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, env=env, cwd=cfg.cwd,
                preexec_fn=engine_preexec(os.getpid()),
            )
        except OSError as exc:
            raise EngineStartError(
                f"cannot run engine command {self.command.argv[0]!r}: {exc}"
            ) from exc
        finally:
            logf.close()
        if cfg.watchdog:
            await self._start_watchdog(self._proc.pid)
        self._watcher = LogWatcher(cfg.log_path, cfg.fatal_patterns, self._on_fatal,
                                   self._clock, start_offset=offset, interval_s=cfg.log_poll_s)
        self._tasks.append(asyncio.create_task(self._watch_exit(self._proc), name="engine-exit"))
        self._tasks.append(asyncio.create_task(self._track_tree(self._proc), name="engine-tree"))
        self._tasks.append(asyncio.create_task(self._watcher.run(), name="engine-log"))
        try:
            info = await self._wait_ready(self._proc.pid)
        except BaseException:
            await self.stop(drain_timeout_s=5.0)
            raise
        self.info = info
        served = ", ".join(m.id for m in info.models)
        self._transition(EngineState.READY,
                         f"{engine_phrase(self.command.kind)} serving {served}")
        self._tasks.append(asyncio.create_task(self._health_loop(), name="engine-health"))
        return info

    async def _start_watchdog(self, engine_pid: int) -> None:
        try:
            self._watchdog = await asyncio.create_subprocess_exec(
                *watchdog_command(engine_pid, os.getpid()), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:  # the process group and the parent-death signal still hold
            log.warning("cannot start the engine watchdog (%s); grandchildren that leave the "
                        "engine's process group may outlive a crash", exc)

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
        next_note = self._clock.now() + cfg.progress_interval_s
        log.info("waiting for %s at %s (timeout %.0f s; log: %s)",
                 engine_phrase(self.command.kind), self.command.base_url, cfg.ready_timeout_s,
                 cfg.log_path)
        while True:
            if self._clock.now() >= next_note:
                next_note = self._clock.now() + cfg.progress_interval_s
                log.info("still waiting for the engine after %.0f s (%s)",
                         self._clock.now() - self._started_at, last)
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
                if data or cfg.model_ids:
                    adapter = self.command.adapter
                    probed = await self._probed_context() if adapter.props_path else None
                    models = served_models(data, self.command.argv, cfg.default_max_context,
                                           adapter, probed, cfg.model_ids)
                    log.info("engine ready after %.1f s: %s", self._clock.now() -
                             self._started_at, ", ".join(f"{m.id} (context {m.max_context}, "
                                                         f"{m.quantization})" for m in models))
                    return EngineInfo(
                        kind=self.command.kind, base_url=self.command.base_url,
                        models=models, pid=pid, log_path=cfg.log_path,
                    )
                last = ("/v1/models lists no model (declare the served ids with --model-id)")
            except ProbeError as exc:
                last = str(exc)
            await self._sleep_or_state(min(cfg.ready_poll_s, max(0.0, remaining)))

    async def _probed_context(self) -> int | None:
        """llama-server's running context from /props (default_generation_settings.n_ctx)."""
        path = self.command.adapter.props_path
        if path is None:
            return None
        return props_context(await self._probe.get_json(self.command.base_url, path,
                                                        self.config.health_timeout_s))

    async def model_roles(self) -> dict[str, ModelRole] | None:
        """Each served model's prefill/decode role as the engine reports it now (a role flip,
        ThunderServe's lightweight rescheduling, changes it without a restart); None if the
        engine does not answer."""
        try:
            data = await self._probe.models(self.command.base_url, self.config.health_timeout_s)
        except ProbeError:
            return None
        return {str(d["id"]): role_of(d, self.command.argv) for d in data
                if isinstance(d, dict) and isinstance(d.get("id"), str)}

    async def set_role(self, role: ModelRole) -> None:
        """Flip the engine's prefill/decode role (no restart). Raises ProbeError when the
        engine cannot flip roles or refused."""
        path = self.command.adapter.role_path
        if path is None:
            raise ProbeError(f"{engine_phrase(self.command.kind)} cannot flip roles")
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http, http.post(
                    self.command.base_url + path, json={"role": str(role)}) as resp:
                if resp.status != 200:
                    raise ProbeError(f"{path} answered {resp.status}: "
                                     f"{await error_text(resp)}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProbeError(f"{path}: {exc!r}") from exc

    async def load(self) -> EngineLoad | None:
        """The engine's own load (its /metrics, or llama-server's /slots); None if it tells
        nothing. Prefix hit rates from cumulative counters are turned into a recent rate."""
        adapter, url, timeout = self.command.adapter, self.command.base_url, \
            self.config.health_timeout_s
        got: EngineLoad | None = None
        if adapter.metrics_path is not None:
            text = await self._probe.get_text(url, adapter.metrics_path, timeout)
            if text is not None:
                got = load_from_metrics(adapter.metrics_format, text)
        if got is None and adapter.slots_path is not None:
            got = load_from_slots(await self._probe.get_json(url, adapter.slots_path, timeout))
        if got is None:
            return None
        rate = self._prefix.update(got)
        return dataclasses.replace(got, prefix_hit_rate=rate)

    @property
    def uptime_s(self) -> float:
        return self._clock.now() - self._started_at

    async def _sleep_or_state(self, seconds: float) -> None:
        """Sleep, but wake early when the state changes (exit or fatal log line)."""
        self._state_changed.clear()
        with contextlib.suppress(TimeoutError):
            await with_timeout(self._clock, self._state_changed.wait(), seconds)

    async def _track_tree(self, proc: asyncio.subprocess.Process) -> None:
        """Remember the engine's descendants (the watchdog does the same from outside)."""
        while proc.returncode is None:
            found = await asyncio.to_thread(descendants, proc.pid)
            self._known.update(found)
            await asyncio.sleep(1.0)

    async def _watch_exit(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self.exit_code = code
        # The main process is gone: its children (vLLM's EngineCore and workers hold the
        # GPU) go with it, at once.
        kill_tree(proc.pid, self._known.items())
        if self._watcher is not None:
            try:
                await self._watcher.scan()  # a fatal line printed just before exiting wins
            except Exception:
                log.exception("engine log scan after exit %s failed", code)
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
            kill_tree(proc.pid, self._known.items())  # stragglers, in the group or not
            self.exit_code = proc.returncode
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.kill()
            await self._watchdog.wait()
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
